"""`memlib submit` against a real Ray head started here (`ray start --head --block`), over HTTP."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from tests.jobs.conftest import run_cli, write_jsonl

pytestmark = pytest.mark.ray
RAY = Path(sys.executable).with_name("ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head(jobs_env_module):
    """A head node in its own process group; teardown ends exactly that group."""
    port, dash = _free_port(), _free_port()
    tmp = tempfile.mkdtemp(prefix="/tmp/rjs")
    proc = subprocess.Popen([str(RAY), "start", "--head", "--block", "--port", str(port), "--node-ip-address",
                             "127.0.0.1", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
                             "--num-cpus", "2", "--temp-dir", tmp, "--include-dashboard", "true",
                             # other Ray instances on this machine may hold the default agent ports
                             "--dashboard-agent-listen-port", str(_free_port()),
                             "--dashboard-agent-grpc-port", str(_free_port()),
                             "--runtime-env-agent-port", str(_free_port()),
                             "--metrics-export-port", str(_free_port())],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"http://127.0.0.1:{dash}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{address}/api/version", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(2)
    else:
        os.killpg(proc.pid, signal.SIGTERM)
        pytest.fail("the Ray head's dashboard did not come up")
    if not _agent_ready(address, deadline):
        os.killpg(proc.pid, signal.SIGTERM)
        pytest.fail("the Ray head's job agent did not come up")
    yield address
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def _agent_ready(address: str, deadline: float) -> bool:
    """The Jobs API answers before its agent accepts jobs: submit a no-op until one is accepted."""
    from ray.job_submission import JobSubmissionClient

    from jobs.submit import wait

    while time.monotonic() < deadline:
        try:
            job = JobSubmissionClient(address).submit_job(entrypoint="true")
        except RuntimeError:
            time.sleep(2)
            continue
        wait(address, job, timeout_s=120)
        return True
    return False


@pytest.fixture(scope="module")
def jobs_env_module():
    mp = pytest.MonkeyPatch()
    for k, v in {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}.items():
        mp.setenv(k, v)
    mp.delenv("RAY_ADDRESS", raising=False)
    yield
    mp.undo()


def test_jobs_submit_build_runs_on_the_cluster(ray_head, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", ["emil", "gus"])
    store = tmp_path / "store"
    res = run_cli(["submit", "build", "--address", ray_head, "--python", sys.executable, "--wait",
                   "--input", str(inp), "--format", "jsonl", "--out", str(store)])
    job = res.output.strip().splitlines()[0] if res.output.strip() else ""
    logs = run_cli(["submit", "logs", job, "--address", ray_head]).output if job else ""
    assert res.exit_code == 0, res.output + logs
    assert run_cli(["submit", "status", job, "--address", ray_head]).output.strip() == "SUCCEEDED"
    assert "published v000001" in logs
    from memlib.io.store import StoreReader

    r = StoreReader(store)
    assert r.tenants() == ["emil", "gus"] and r.nodes().num_rows == r.manifest["row_counts"]["nodes"] > 0


def test_jobs_submit_stop_and_failure_status(ray_head, tmp_path):
    res = run_cli(["submit", "build", "--address", ray_head, "--python", sys.executable,
                   "--input", str(tmp_path / "missing.jsonl"), "--format", "jsonl", "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    job = res.output.strip()
    from jobs.submit import JobStatus, wait

    assert wait(ray_head, job, timeout_s=300) == JobStatus.FAILED
    assert "missing.jsonl: file not found" in run_cli(["submit", "logs", job, "--address", ray_head]).output
    assert run_cli(["submit", "stop", job, "--address", ray_head]).output.strip() == "not running"


def test_jobs_submit_paths_and_runtime_env(tmp_path, monkeypatch):
    from jobs.submit import JobCommand, SubmitOptions, absolute_paths, entrypoint, runtime_env

    monkeypatch.chdir(tmp_path)
    args = absolute_paths(["--input", "in.jsonl", "--out=st", "--format", "jsonl", "-o", "s3://bucket/x"])
    assert args == ["--input", str(tmp_path / "in.jsonl"), f"--out={tmp_path / 'st'}", "--format", "jsonl",
                    "-o", "s3://bucket/x"]
    assert entrypoint(JobCommand.BUILD, ["--out", "a b"]) == "python -m jobs.cli build --out 'a b'"
    env = runtime_env(SubmitOptions(with_requirements=True))
    assert ".venv" in env["excludes"] and any(r.startswith("ray[") for r in env["pip"])
    assert "pip" not in runtime_env(SubmitOptions())
    from pipelines.operators import WORKER_ENV

    assert WORKER_ENV.items() <= env["env_vars"].items()  # the operators then ask for no runtime_env


@pytest.mark.slow
def test_jobs_bench_nightly_submits_its_builds_to_the_cluster(ray_head, shared_data, tmp_path):
    """``memlib bench nightly --submit``: the full build, the nightly run and the comparison build
    are jobs on the running cluster; the nightly job computes only the new sessions and its store
    equals the full build's."""
    data = json.loads((shared_data / "longmemeval_s_dev24.json").read_text(encoding="utf-8"))
    small = []
    for item in data[:3]:
        keep = 6
        small.append({**item, "haystack_sessions": item["haystack_sessions"][:keep],
                      "haystack_session_ids": item["haystack_session_ids"][:keep],
                      "haystack_dates": item["haystack_dates"][:keep]})
    inp = tmp_path / "small.json"
    inp.write_text(json.dumps(small), encoding="utf-8")
    res = run_cli(["bench", "nightly", "--input", str(inp), "--touched", "2", "--submit", ray_head,
                   "--strategies", "bm25", "--workdir", str(tmp_path / "w")])
    assert res.exit_code == 0, res.output + repr(res.exception)
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["submitted_to"] == ray_head and out["fresh_process"] is False
    assert 0 < out["nightly_s"] < out["full_build_s"] and out["nightly_built"] and len(out["nightly_built"]) == 2
    # the new sessions come last in time: only they are computed, no earlier session is renumbered
    assert out["nightly_sessions"]["sessions_computed"] == 2 and out["equal_to_full_build"] is True
    assert out["recall_nightly"] == out["recall_full"]
