"""Fault tolerance: a build worker killed mid-build, and a driver crash followed by a resuming rerun.
The subprocess tests run each build in its own process group (its own local Ray), so they kill only
what they started (about 1.5 min together on an idle 2-core box, so they run in the default suite).
A third variant interrupts the driver in-process (an exception after the first finished tenant) and
reruns."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.jobs.conftest import ALL, node_rows, write_jsonl

pytestmark = pytest.mark.ray
# the build's Ray Data actors: the embed operator, the session-local stages, the tenant stages
ACTORS = ("EmbedOp", "SessionLocalOp", "TenantOp")
# one tenant a row (its own part and ``_done`` file): the tests wait for a first finished tenant
# and act before the build publishes; with the default rows all 4 tenants finish in one row, and a
# fast build can publish (removing ``_done``) between two polls
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1",
       "MEMLIB__RAY__TENANT_BATCH_TURNS": "1"}


def _start_build(inp: Path, store: Path) -> subprocess.Popen:
    """The build in its own session, its output in a log file next to the store: a pipe nobody
    reads while the test polls would fill up and block the build."""
    ENV.pop("RAY_ADDRESS", None)
    log = store.parent / f"{store.name}-{time.monotonic_ns()}.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "jobs.nightly", "--input", str(inp), "--format", "jsonl",
                                 "--out", str(store), "--num-cpus", "2"], env=ENV, start_new_session=True,
                                stdout=out, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2])
    proc.log = log  # type: ignore[attr-defined]
    return proc


def _finish(proc: subprocess.Popen, timeout_s: float = 900) -> str:
    """Wait for the build; its output (tail) for assertion messages."""
    proc.wait(timeout=timeout_s)
    return proc.log.read_text(errors="replace")[-3000:]  # type: ignore[attr-defined]


def _wait_for(pred, timeout_s: float = 600.0, every: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(every)
    return False


def _actor_procs(proc: subprocess.Popen) -> list[psutil.Process]:
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for p in kids:
        try:
            if any(name in " ".join(p.cmdline()) for name in ACTORS):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the build and every process it started (Ray's GCS, raylet, workers), by pid."""
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        kids = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for k in kids:
        try:
            k.kill()
        except psutil.Error:
            pass
    proc.wait(60)


class DriverCrash(RuntimeError):
    """Raised by the progress callback: the driver stops right after a tenant finished."""


def _crash_after_first_tenant(event: str, info: dict) -> None:
    if event == "tenant":
        raise DriverCrash(info["tenant_id"])


def test_jobs_fault_driver_interrupted_then_resume_in_process(base_store, tmp_path):
    from jobs.builder import DONE_DIR, run_incremental
    from memlib.config import MemlibConfig

    inp = write_jsonl(tmp_path / "in.jsonl", ALL)
    store = tmp_path / "store"
    cfg = MemlibConfig()
    with pytest.raises(DriverCrash) as crash:
        run_incremental(cfg, inp, "jsonl", store, num_cpus=2, progress=_crash_after_first_tenant)
    first = str(crash.value)
    assert (store / "versions" / "v000001" / DONE_DIR / f"{first}.json").exists()
    assert not (store / "manifest.json").exists()
    m = run_incremental(cfg, inp, "jsonl", store, num_cpus=2)
    assert m["version"] == "v000001" and first in m["incremental"]["resumed"]
    assert sorted(m["incremental"]["resumed"] + m["incremental"]["built"]) == ALL
    rows = node_rows(store)
    assert len({r[0] for r in rows}) == len(rows)  # no tenant written twice
    assert rows == node_rows(base_store[1])


def test_jobs_fault_worker_killed_mid_build(base_store, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", ALL)
    store = tmp_path / "store"
    proc = _start_build(inp, store)
    try:
        seen: list[psutil.Process] = []
        assert _wait_for(lambda: seen.extend(_actor_procs(proc)) or seen, 300), "no build actor appeared"
        time.sleep(1)  # let the actor start on a block or a tenant (a small build's actors live a few seconds)
        victims = _actor_procs(proc) or [p for p in seen if p.is_running()]
        assert victims, f"the build's actors ended before one could be killed: {_finish(proc)[-2000:]}"
        victims[0].kill()
        out = _finish(proc)
    finally:
        if proc.poll() is None:
            _kill_group(proc)
    assert proc.returncode == 0, out
    assert node_rows(store) == node_rows(base_store[1])


def test_jobs_fault_driver_crash_then_resume(base_store, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", ALL)
    store = tmp_path / "store"
    done = store / "versions" / "v000001" / "_done"
    proc = _start_build(inp, store)
    try:
        assert _wait_for(lambda: done.exists() and any(done.glob("*.json")), 600), "no tenant finished"
    finally:
        _kill_group(proc)
    finished = sorted(p.stem for p in done.glob("*.json"))
    assert finished and not (store / "manifest.json").exists()
    rerun = _start_build(inp, store)
    out = _finish(rerun)
    assert rerun.returncode == 0, out
    m = json.loads((store / "manifest.json").read_text())
    assert set(finished) <= set(m["incremental"]["resumed"]) and m["version"] == "v000001"
    assert sorted(m["incremental"]["resumed"] + m["incremental"]["built"]) == ALL
    rows = node_rows(store)
    assert len({r[0] for r in rows}) == len(rows)  # no duplicates
    assert rows == node_rows(base_store[1])


def test_jobs_fault_sigterm_says_what_is_kept_and_the_next_build_resumes(tmp_path):
    """``memlib build`` stopped by SIGTERM (a pod evicted, a scheduler's timeout) after its first
    tenant: exit 143 with one message saying nothing was published and what the next run resumes,
    no Ray process left behind, and the next build resumes the finished tenants."""
    inp = write_jsonl(tmp_path / "in.jsonl", ALL)
    store = tmp_path / "store"
    done = store / "versions" / "v000001" / "_done"
    log = tmp_path / "build.log"
    cmd = [sys.executable, "-m", "jobs.cli", "build", "--input", str(inp), "--format", "jsonl", "--out", str(store),
           "--num-cpus", "2"]
    ENV.pop("RAY_ADDRESS", None)
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=ENV, start_new_session=True, stdout=out, stderr=subprocess.STDOUT,
                                cwd=Path(__file__).resolve().parents[2])
    try:
        assert _wait_for(lambda: done.exists() and any(done.glob("*.json")), 600), log.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)  # the driver only, as a scheduler would
        proc.wait(120)
    finally:
        if proc.poll() is None:
            _kill_group(proc)
    text = log.read_text(errors="replace")
    assert proc.returncode == 143, text[-3000:]
    assert f"interrupted (SIGTERM): nothing was published to {store}; it serves nothing yet" in text
    assert "Traceback" not in text
    assert not (store / "manifest.json").exists()

    def group_gone() -> bool:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return True
        return False

    assert _wait_for(group_gone, 60), "the interrupted build left Ray processes running"
    finished = sorted(p.stem for p in done.glob("*.json"))
    rerun = _start_build(inp, store)
    out = _finish(rerun)
    assert rerun.returncode == 0, out
    m = json.loads((store / "manifest.json").read_text())
    assert finished and set(finished) <= set(m["incremental"]["resumed"])
