"""The command line only parses and prints: every command and bench subcommand loads from
jobs/cli (so each module's imports resolve after the moves), and the measuring helpers the
benches share live outside it (jobs/bench/measure.py, jobs/bench/serve_load.py)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.cli import app

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ["build", "check-env", "demo-report", "eval", "fit-assomem", "inspect", "mcp", "query", "serve",
            "submit", "tune", "bench"]
BENCHES = ["build", "embed", "llm", "nightly", "ppr", "scale", "serve"]


@pytest.mark.parametrize("args", [[c, "--help"] for c in COMMANDS] + [["bench", b, "--help"] for b in BENCHES])
def test_every_command_loads(args):
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output


def test_bench_modules_import_no_other_bench_module():
    for path in sorted((ROOT / "jobs" / "cli").glob("bench_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        mods = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        assert not [m for m in mods if m.startswith("jobs.cli.bench_")], path.name


def test_rss_sampler_sees_this_process():
    from jobs.bench.measure import RssSampler

    with RssSampler(interval_s=0.01) as rss:
        block = bytearray(64 << 20)
        block[::4096] = b"x" * len(block[::4096])
    assert rss.peak > 64 << 20
