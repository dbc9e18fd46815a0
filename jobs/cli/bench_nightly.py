"""``memlib bench nightly``: what a nightly run costs against a full build, and that it is right.

1. Full build of the input (LongMemEval format; default ../shared/data/longmemeval_s_dev24.json).
2. One new session appended to each of ``--touched`` tenants (a session of another tenant's
   haystack, its has_answer flags dropped, dated at the tenant's latest session), then an
   incremental (nightly) run on the same store.
3. A full build of the new input into a second store; the two published stores are compared
   (node ids, node texts, edges and vectors) and ``auto`` / ``bm25`` recall is evaluated on both.

By default the full build and the nightly run are each a ``memlib build`` child process (with
its own local Ray, as a cron job on one machine runs them: both pay Ray's start and stop);
``--same-process`` starts Ray here first and runs both on it, as jobs submitted to a running
cluster find it up (neither pays Ray's start). ``--submit ADDRESS`` submits both as Ray jobs to
the running cluster whose dashboard is at ADDRESS (:mod:`jobs.submit`, as ``memlib submit`` does:
a fresh driver on a cluster that is up, the production path); their times are the jobs' own, from
the job's start to its end as Ray records them (the working directory's upload is not counted).

Prints one JSON line: full_build_s, nightly_s, nightly_ratio = nightly_s / full_build_s,
sessions computed by the nightly run, equal_to_full_build and the recall of both stores.
"""
from __future__ import annotations

import copy
import json
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from jobs.cli.common import ConfigOpt, SetOpt, get_config


def append_sessions(data: list[dict[str, Any]], touched: int) -> list[dict[str, Any]]:
    """A copy of LongMemEval ``data`` with one new session at the end of the first ``touched``
    haystacks, taken from the haystack ``touched`` places further on."""
    out = copy.deepcopy(data)
    for i in range(min(touched, len(out))):
        item, donor = out[i], data[(i + touched) % len(data)]
        session = [{k: v for k, v in turn.items() if k != "has_answer"} for turn in donor["haystack_sessions"][0]]
        item["haystack_sessions"].append(session)
        item["haystack_session_ids"].append(f"nightly_{i}")
        # dated at the tenant's latest session ("YYYY/MM/DD (Day) HH:MM" sorts as it reads): the
        # haystack's list order is not chronological, and the list's last date would put the new
        # session amid the history, renumbering (and so recomputing) the sessions after it
        item["haystack_dates"].append(max(item["haystack_dates"]))
    return out


def store_snapshot(store: Path):
    """Published nodes (every column, importance included) and edges (with weights), sorted, for
    comparing two stores."""
    import numpy as np
    import polars as pl

    from memlib import schema
    from memlib.io.store import StoreReader

    r = StoreReader(store)
    nodes = r.nodes(columns=[f.name for f in schema.NODES]).sort_by("node_id")
    emb = nodes.column("embedding").combine_chunks()
    vectors = emb.values.to_numpy(zero_copy_only=False).reshape(-1, emb.type.list_size)
    edges = pl.from_arrow(r.table("edges").select(["src", "dst", "kind", "relation", "weight"])).sort(
        ["src", "dst", "kind", "relation"], nulls_last=True)
    return pl.from_arrow(nodes.drop_columns(["embedding"])), vectors, edges, np


def compare_stores(a: Path, b: Path) -> dict[str, Any]:
    na, va, ea, np = store_snapshot(a)
    nb, vb, eb, _ = store_snapshot(b)
    same_nodes = na.equals(nb)
    return {"equal_to_full_build": bool(same_nodes and ea.equals(eb) and va.shape == vb.shape and
                                        (va.size == 0 or float(np.abs(va - vb).max()) < 1e-6)),
            "nodes": len(na), "same_node_ids": na["node_id"].to_list() == nb["node_id"].to_list(),
            "same_edges": ea.equals(eb),
            "max_vector_diff": float(np.abs(va - vb).max()) if same_nodes and va.size else None}


def recall(store: Path, data: Path, cfg, strategies: list[str]) -> dict[str, float | None]:
    """Turn recall@10 of each strategy over the input's questions."""
    from memlib.eval.questions import Dataset, read_questions
    from memlib.eval.runner import evaluate

    run = evaluate(store, read_questions(data, Dataset.LONGMEMEVAL, cfg), strategies, [10], cfg,
                   dataset=Dataset.LONGMEMEVAL)
    return {s: run.metrics["strategies"][s].get("turn_recall@10") for s in strategies}


def submitted_build(address: str, args: list[str], timeout_s: float = 7200.0) -> float:
    """Run ``memlib build ARGS`` as a job on the cluster at ``address``; the job's own seconds."""
    import sys

    from ray.job_submission import JobStatus

    from jobs.submit import JobCommand, SubmitOptions, client, logs, submit, wait

    job = submit(JobCommand.BUILD, args, SubmitOptions(address=address, python=sys.executable))
    state = wait(address, job, timeout_s=timeout_s, poll_s=0.5)
    if state != JobStatus.SUCCEEDED:
        raise typer.BadParameter(f"job {job} ended {state}: {logs(address, job)[-2000:]}")
    info = client(address).get_job_info(job)
    return (info.end_time - info.start_time) / 1000.0


def register(bench_app: typer.Typer) -> None:
    @bench_app.command("nightly")
    def bench_nightly(
        input: Annotated[Path, typer.Option("--input", "-i")] = Path("../shared/data/longmemeval_s_dev24.json"),
        touched: Annotated[int, typer.Option("--touched", help="tenants that get one new session")] = 3,
        config: ConfigOpt = None,
        set_: SetOpt = None,
        num_cpus: Annotated[Optional[int], typer.Option("--num-cpus")] = None,
        strategies: Annotated[str, typer.Option("--strategies")] = "auto,bm25",
        workdir: Annotated[Optional[Path], typer.Option("--workdir", help="keep the stores here")] = None,
        fresh: Annotated[bool, typer.Option("--fresh-process/--same-process", help="run the full build and the "
                                            "nightly run each in a process of its own (with its own Ray start "
                                            "and stop, as a cron job on one machine would), or both in this one "
                                            "on a Ray started before either (as jobs submitted to a running "
                                            "cluster)")] = True,
        submit_to: Annotated[Optional[str], typer.Option("--submit", help="submit the three builds as jobs to "
                                                         "the Ray cluster whose dashboard is at this address "
                                                         "(e.g. http://127.0.0.1:8265); times are the jobs' "
                                                         "own")] = None,
    ) -> None:
        """Full build, one new session in a few tenants, nightly run; cost ratio and equality."""
        from jobs.local_ray import export_local_ray_env

        export_local_ray_env()
        cfg = get_config(config, set_)
        from jobs.bench.measure import build_args, timed_build
        from jobs.builder import run_build
        from jobs.local_ray import init_ray

        with tempfile.TemporaryDirectory(prefix="memlib-bench-") as tmp:
            work = workdir or Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            data = json.loads(Path(input).read_text(encoding="utf-8"))
            new_input = work / "nightly_input.json"
            new_input.write_text(json.dumps(append_sessions(data, touched)), encoding="utf-8")
            store, full = work / "store", work / "full"
            if submit_to:  # jobs on a running cluster, each a fresh driver: the production path
                full_s = submitted_build(submit_to, build_args(input, store, "longmemeval", config, set_))
                nightly_s = submitted_build(submit_to, build_args(new_input, store, "longmemeval", config, set_,
                                                                  ("--incremental",)))
                submitted_build(submit_to, build_args(new_input, full, "longmemeval", config, set_))
                m = json.loads((store / "manifest.json").read_text(encoding="utf-8"))
            elif fresh:  # each run is a job of its own, as from cron: its own process and local Ray
                full_s = timed_build(input, store, num_cpus, None, work / "full_build.log", config, set_,
                                     "longmemeval")
                nightly_s = timed_build(new_input, store, num_cpus, None, work / "nightly.log", config, set_,
                                        "longmemeval", ("--incremental",))
                m = json.loads((store / "manifest.json").read_text(encoding="utf-8"))
            else:  # one process with Ray started first: both runs find it up, as jobs on a running cluster do
                init_ray(None, num_cpus, token_auth=cfg.ray.local_token_auth)
                start = time.perf_counter()
                run_build(cfg, input, "longmemeval", store, num_cpus=num_cpus)
                full_s = time.perf_counter() - start
                start = time.perf_counter()
                m = run_build(cfg, new_input, "longmemeval", store, full=False, num_cpus=num_cpus)
                nightly_s = time.perf_counter() - start
            if not submit_to:
                run_build(cfg, new_input, "longmemeval", full, num_cpus=num_cpus)
            out: dict[str, Any] = {
                "input": str(input), "touched": touched, "fresh_process": fresh and not submit_to,
                "submitted_to": submit_to, "full_build_s": round(full_s, 2),
                "nightly_s": round(nightly_s, 2), "nightly_ratio": round(nightly_s / full_s, 4),
                "nightly_built": m["incremental"]["built"], "nightly_sessions": m.get("sessions"),
                "nightly_stage_timings_s": m.get("stage_timings_s"), **compare_stores(store, full)}
            names = [s for s in strategies.split(",") if s]
            if names:
                out["recall_nightly"] = recall(store, new_input, cfg, names)
                out["recall_full"] = recall(full, new_input, cfg, names)
        typer.echo(json.dumps(out))
