"""What every ``memlib`` process imports before its command runs (``jobs.cli`` registers every
command): polars, the bench helpers' psutil, lancedb, spaCy, numba and Ray are imported by the
commands that use them, not by ``memlib --help`` or a command that does not."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

HEAVY = ("polars", "psutil", "jobs.bench.measure", "lancedb", "spacy", "numba", "ray", "onnxruntime")


def test_core_cli_registers_its_commands_without_heavy_imports():
    code = ("import json, sys, jobs.cli, typer; typer.main.get_command(jobs.cli.app); "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1]) == []
