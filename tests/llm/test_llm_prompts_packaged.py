"""A non-editable install finds its prompts: the wheel built from this tree
carries prompts/ as package data, and memlib installed from it (pip --target, loaded from a
directory outside the repository) loads every prompt with the same hashes as the source tree,
and its command line (the ``memlib`` console script, ``python -m jobs.cli``) runs from there."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memlib.llm.models import Task
from memlib.llm.prompts import load_prompts, prompt_hashes

REPO = Path(__file__).resolve().parents[2]
PROBE = ("import json, memlib; from memlib.llm.prompts import DEFAULT_DIR, load_prompts, prompt_hashes; "
         "print(json.dumps({'file': memlib.__file__, 'dir': str(DEFAULT_DIR), "
         "'hashes': prompt_hashes(load_prompts())}))")


def _pip(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.heavy
def test_installed_wheel_loads_its_prompts(tmp_path):
    wheel = _pip("wheel", str(REPO), "--no-deps", "-q", "-w", str(tmp_path / "wheel"), cwd=tmp_path)
    if wheel.returncode != 0 and "Could not find a version that satisfies" in wheel.stderr:
        pytest.skip("building a wheel needs setuptools from the package index, which is not reachable")
    assert wheel.returncode == 0, wheel.stderr[-2000:]
    built = next((tmp_path / "wheel").glob("memlib-*.whl"))
    site = tmp_path / "site"
    inst = _pip("install", "--no-deps", "-q", "--target", str(site), str(built), cwd=tmp_path)
    assert inst.returncode == 0, inst.stderr[-2000:]
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(site)) and out["dir"].startswith(str(site))
    assert out["hashes"] == prompt_hashes(load_prompts()) and len(out["hashes"]) == len(Task)
    # the command line comes with it: the console script and ``python -m jobs.cli`` run from the install
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    script = site / "bin" / "memlib"
    assert "jobs.cli" in script.read_text()
    for cmd in ([sys.executable, str(script), "--help"], [sys.executable, "-m", "jobs.cli", "--help"]):
        ran = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
        assert ran.returncode == 0 and "build" in ran.stdout, ran.stderr[-2000:]
    probe = "import jobs.cli, memlib; print(jobs.cli.__file__)"
    where = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert where.stdout.strip().startswith(str(site)), where.stderr[-2000:]
