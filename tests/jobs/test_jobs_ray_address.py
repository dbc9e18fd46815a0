"""A cluster address nobody answers at is one line and exit 2: ``ray.init`` alone
retried a dead address for minutes, printing only Ray's own warnings."""
from __future__ import annotations

import time

import pytest

from jobs.local_ray import RayUnavailable, probe_address
from memlib import SAMPLE as SAMPLE_PATH


@pytest.mark.heavy
def test_a_build_on_an_address_nobody_answers_at_is_one_line(tmp_path):
    """In a process of its own, as from a shell (a test process may have joined a Ray already)."""
    import os
    import subprocess
    import sys

    out = tmp_path / "store"
    started = time.monotonic()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}
    env.pop("RAY_ADDRESS", None)
    res = subprocess.run([sys.executable, "-m", "jobs.cli", "build", "--input", str(SAMPLE_PATH), "--out", str(out),
                          "--address", "127.0.0.1:1"], capture_output=True, text=True, timeout=120, env=env)
    output = res.stdout + res.stderr
    assert res.returncode == 2, output
    errors = [ln for ln in output.splitlines() if "no Ray cluster answers at 127.0.0.1:1" in ln]
    assert len(errors) == 1 and "Traceback" not in output, output
    assert time.monotonic() - started < 60
    assert not (out / "manifest.json").exists() and not list((out / "versions").glob("v*"))


@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1", "[::1]:1"])
def test_probe_refuses_a_closed_port(address):
    with pytest.raises(RayUnavailable, match="no Ray cluster answers"):
        probe_address(address, timeout_s=2.0)


def test_probe_leaves_other_forms_to_ray():
    probe_address("auto")


@pytest.mark.ray
def test_a_stopped_local_ray_gives_back_the_environment():
    """start_local sets RAY_AUTH_MODE=token and a fresh token in this process for its instance;
    stop_local gives the earlier values back, so a program that built from Python (or a test)
    does not start its next Ray, or a cluster, in a stopped instance's token mode."""
    import subprocess
    import sys

    code = ("import os; os.environ['RAY_AUTH_MODE'] = 'disabled'; os.environ.pop('RAY_AUTH_TOKEN', None)\n"
            "from jobs.local_ray import start_local, stop_local\n"
            "start_local(1, token_auth=True)\n"
            "during = (os.environ.get('RAY_AUTH_MODE'), 'RAY_AUTH_TOKEN' in os.environ)\n"
            "assert stop_local()\n"
            "print(during, (os.environ.get('RAY_AUTH_MODE'), 'RAY_AUTH_TOKEN' in os.environ))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True)
    assert out.stdout.strip().splitlines()[-1] == "('token', True) ('disabled', False)", out.stdout + out.stderr


@pytest.mark.ray
def test_relative_paths_are_the_callers_directory_when_ray_runs_already(ray_local, tmp_path, monkeypatch):
    """Ray's workers keep the directory Ray was started in: a build given relative paths after the
    caller changed directory reads and writes under the caller's directory (before, the workers
    wrote the tenants' files under Ray's, and the driver published a version with no tenant)."""
    import shutil

    from jobs.api import build

    shutil.copy(SAMPLE_PATH, tmp_path / "in.jsonl")
    monkeypatch.chdir(tmp_path)
    manifest = build("in.jsonl", "store/")
    assert sorted(manifest["tenants"]) == ["elena", "maya", "raj", "tomas-lena"]
    assert (tmp_path / "store" / "manifest.json").is_file()
