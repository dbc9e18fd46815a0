"""``memlib bench tenants``: what a build and its nightly runs cost over many small tenants.

A synthetic enterprise (:mod:`jobs.bench.enterprise`: each real session of the template files a
tenant, repeated under new ids and moved dates until ``--tenants`` exist, ``--turns`` turns in
all) is built; then ``--nights`` nightly runs in which ``--touched`` of the tenants (others each
night) get one new session (the nightly input holds just them), then one in which every tenant
gets one. The same turns as ``--groups``
tenants give the per-turn baseline. Each run is a ``memlib build`` child process with its own
local Ray, as cron runs it. Prints one JSON line: walls, turns/s, the driver's phases, files
and Lance fragments/versions of the store, nightly ratios, driver and worker peak RSS.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from jobs.cli.common import ConfigOpt, SetOpt

DEFAULT_TEMPLATES = "../shared/data/locomo_dev3.json,../shared/data/longmemeval_s_dev24.json"


class PeakRss:
    """Peak RSS of a child process (the driver) and the peak sum over its descendants (Ray's
    processes and workers), sampled every ``interval_s``."""

    def __init__(self, pid: int, interval_s: float = 0.5):
        self.pid, self.interval_s = pid, interval_s
        self.driver = self.workers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                proc = psutil.Process(self.pid)
                self.driver = max(self.driver, proc.memory_info().rss)
                total = 0
                for p in proc.children(recursive=True):
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:
                        continue
                self.workers = max(self.workers, total)
            except psutil.Error:
                pass
            self._stop.wait(self.interval_s)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        mb = lambda b: round(b / 2**20, 1)  # noqa: E731
        return {"driver_peak_rss_mb": mb(self.driver), "workers_peak_rss_mb": mb(self.workers)}


def run_build(data: Path, store: Path, log: Path, config: Optional[Path], sets: Optional[list[str]],
              incremental: bool = False) -> dict[str, Any]:
    """``memlib build`` of ``data`` into ``store`` in a child process: wall seconds, peak RSS and
    the published manifest's driver phases."""
    from jobs.bench.measure import build_args

    cmd = [sys.executable, "-m", "jobs.cli", "build",
           *build_args(data, store, "jsonl", config, sets, ("--incremental",) if incremental else ())]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        rss = PeakRss(proc.pid)
        code = proc.wait()
    wall = time.perf_counter() - start
    peaks = rss.stop()
    if code != 0:
        raise typer.BadParameter(f"memlib build exited {code}: {log.read_text(errors='replace')[-2000:]}")
    m = json.loads((store / "manifest.json").read_text(encoding="utf-8"))
    phases = m.get("stage_timings_s", {})
    return {"wall_s": round(wall, 2), "phases_s": {k: phases.get(k) for k in
                                                    ("read", "ray_start", "tenants", "write", "index", "publish")},
            "built": len(m["incremental"]["built"]), "version": m["version"], **peaks}


def store_shape(store: Path) -> dict[str, Any]:
    """Files of the published version, Lance fragments and versions per table, cache files."""
    from memlib.io.store import StoreReader, lance_shape

    r = StoreReader(store)
    version_files = sum(len(files) for _, _, files in os.walk(r.version_dir))
    lance = lance_shape(store)
    return {"version_files": version_files, "lance_fragments": {k: v["fragments"] for k, v in lance.items()},
            "lance_versions": {k: v["versions"] for k, v in lance.items()},
            "cache_files": sum(len(f) for _, _, f in os.walk(store / "cache")) if (store / "cache").exists() else 0,
            "tenants": len(r.tenants())}


def register(bench_app: typer.Typer) -> None:
    @bench_app.command("tenants")
    def bench_tenants(
        tenants: Annotated[int, typer.Option("--tenants", "-n", help="tenants of the synthetic enterprise")] = 1000,
        turns: Annotated[Optional[int], typer.Option("--turns", help="total turns (each tenant's session is cut "
                                                     "to turns/tenants); default: 5 per tenant")] = None,
        mix: Annotated[bool, typer.Option("--mix", help="tenant sizes by a Zipf law (1-50 whole sessions)")] = False,
        touched: Annotated[float, typer.Option("--touched", help="share of tenants with a new session in the "
                                               "first nightly run")] = 0.01,
        groups: Annotated[int, typer.Option("--groups", help="tenants of the per-turn baseline (0: skip it)")] = 10,
        nights: Annotated[int, typer.Option("--nights", min=1, help="nightly runs with --touched tenants (each "
                                            "night others), before the one that touches every tenant")] = 1,
        every: Annotated[bool, typer.Option("--every/--no-every", help="also the nightly run that gives every "
                                            "tenant a new session")] = True,
        templates: Annotated[str, typer.Option("--templates", help="comma-separated LoCoMo/LongMemEval files "
                                               "whose sessions make the tenants")] = DEFAULT_TEMPLATES,
        config: ConfigOpt = None,
        set_: SetOpt = None,
        workdir: Annotated[Optional[Path], typer.Option("--workdir", help="keep inputs, stores and logs here")] = None,
    ) -> None:
        """Build, nightly with a few tenants touched, nightly with all touched; one JSON line of figures."""
        from jobs.bench.enterprise import (
            iter_files,
            make_enterprise,
            pick,
            regroup,
            session_templates,
            with_new_session,
        )
        from jobs.local_ray import export_local_ray_env

        export_local_ray_env()
        total = turns or 5 * tenants
        tpl = session_templates(iter_files(t for t in templates.split(",") if t))
        ent = make_enterprise(tpl, tenants, total, mix=mix)
        cap = None if mix else max(1, total // tenants)
        with tempfile.TemporaryDirectory(prefix="memlib-tenants-") as tmp:
            work = workdir or Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            store = work / "store"
            out: dict[str, Any] = {"tenants": tenants, "turns": ent.turns, "mix": mix, "templates": len(tpl)}
            full = run_build(ent.write(work / "base.jsonl"), store, work / "build.log", config, set_)
            out["build"] = {**full, "turns_per_s": round(ent.turns / full["wall_s"], 2)}
            out["store"] = store_shape(store)
            ent1, walls = ent, []
            for night in range(1, nights + 1):
                few = pick(list(ent.tenants), touched, seed=night)
                ent1 = with_new_session(ent1, tpl, few, cap, tag=f"n{night}")
                n1 = run_build(ent1.write(work / f"nightly{night}.jsonl", few), store, work / f"nightly{night}.log",
                               config, set_, incremental=True)
                walls.append(n1["wall_s"])
                if night == 1:
                    out["nightly_touched"] = {**n1, "touched": len(few),
                                              "ratio": round(n1["wall_s"] / full["wall_s"], 4)}
            if nights > 1:
                out["nights"] = {"runs": nights, "median_wall_s": round(statistics.median(walls), 2),
                                 "median_ratio": round(statistics.median(walls) / full["wall_s"], 4),
                                 "max_wall_s": max(walls), "store": store_shape(store)}
            if every:
                ent2 = with_new_session(ent1, tpl, list(ent1.tenants), cap, tag="n2")
                n2 = run_build(ent2.write(work / "nightly2.jsonl"), store, work / "nightly2.log", config, set_,
                               incremental=True)
                out["nightly_every"] = {**n2, "touched": tenants, "ratio": round(n2["wall_s"] / full["wall_s"], 4)}
            out["store_after_nightly"] = store_shape(store)
            if groups:
                base = run_build(regroup(ent, groups).write(work / "grouped.jsonl"), work / "grouped",
                                 work / "grouped.log", config, set_)
                tps = ent.turns / base["wall_s"]
                out["baseline"] = {"tenants": groups, **base, "turns_per_s": round(tps, 2)}
                out["turns_per_s_ratio"] = round(out["build"]["turns_per_s"] / tps, 3)
            ph = full["phases_s"]
            driver = sum(ph.get(k) or 0 for k in ("write", "index", "publish"))
            out["driver_write_index_publish_share"] = round(driver / full["wall_s"], 4)
        typer.echo(json.dumps(out))
