"""The progress display (jobs/progress.py): counts with rate and ETA, a redrawn status line only on a
terminal, one line per phase otherwise; and a real build whose stdout is a file prints those lines
and none of Ray's own (Ray Data's INFO blocks, the core_worker restart warning)."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.progress import BuildProgress, CountProgress, clock, format_count

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "memlib" / "data" / "sample_conversations.jsonl"


class Tick:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_format_count_has_n_of_m_rate_and_eta():
    assert format_count("tenants", 0, 40, 0.0) == "tenants 0/40"  # no rate before the first one
    assert format_count("tenants", 10, 40, 5.0) == "tenants 10/40  2.0/s  ETA 0:15"
    assert format_count("tenants", 3, 40, 60.0) == "tenants 3/40  3.0/min  ETA 12:20"
    assert format_count("tenants", 40, 40, 20.0) == "tenants 40/40  2.0/s"  # done: no ETA
    assert format_count("questions", 7, None, 1.0) == "questions 7  7.0/s"
    assert clock(3725) == "1:02:05" and clock(59.6) == "1:00"


def _events(display: BuildProgress, tick: Tick) -> None:
    display("planned", {"built": ["a", "b", "c", "d"], "carried": [], "tenants": 4, "seconds": 0.2})
    tick.t = 5
    display("phase", {"name": "ray_start", "seconds": 5.0})
    display("tenants_start", {"tenants": 4, "blocks": 2})
    for i, name in enumerate("abcd"):
        tick.t += 1
        if i < 2:
            display("block", {"block_id": str(i)})
        display("tenant", {"tenant_id": name, "turns": 3, "nodes": 9, "edges": 12, "seconds": 0.5})
    display("phase", {"name": "tenants", "seconds": 4.0})
    display("phase", {"name": "write", "seconds": 1.25})


def test_not_a_terminal_prints_one_line_per_phase_and_no_redraws():
    out, tick = io.StringIO(), Tick()
    _events(BuildProgress(stream=out, tty=False, now=tick), tick)
    lines = out.getvalue().splitlines()
    assert lines == ["read: 4 tenant(s) in 0.2s: 4 to build, 0 carried over; starting Ray", "ray: 5.0s",
                     "tenants: blocks 2/2  tenants 4/4  1.0/s  in 4.0s", "write: 1.2s"], lines
    assert "\r" not in out.getvalue()


def test_a_terminal_redraws_the_counters_with_eta():
    out, tick = io.StringIO(), Tick()
    display = BuildProgress(stream=out, tty=True, now=tick, min_interval=0)
    _events(display, tick)
    text = out.getvalue()
    assert "\r\x1b[Kblocks 1/2  tenants 0/4" in text
    assert "blocks 2/2  tenants 2/4  1.0/s  ETA 0:02" in text
    assert "tenants: blocks 2/2  tenants 4/4  1.0/s  in 4.0s\n" in text


def test_close_wipes_the_status_line_on_a_terminal():
    out = io.StringIO()
    display = BuildProgress(stream=out, tty=True)
    display("planned", {"built": ["a"], "carried": [], "tenants": 1, "seconds": 0.1})
    assert out.getvalue().endswith("\r\x1b[Kstarting Ray…")
    display.close()
    assert out.getvalue().endswith("starting Ray…\r\x1b[K")


def test_a_terminal_redraws_at_most_ten_times_a_second():
    out, tick = io.StringIO(), Tick()
    display = BuildProgress(stream=out, tty=True, now=tick)
    display("tenants_start", {"tenants": 1000, "blocks": 0})
    for _ in range(1000):
        tick.t += 0.001
        display("tenant", {"tenant_id": "t"})
    assert 9 <= out.getvalue().count("\r\x1b[Ktenants ") <= 12


def test_verbose_adds_a_line_per_tenant():
    out, tick = io.StringIO(), Tick()
    _events(BuildProgress(verbose=True, stream=out, tty=False, now=tick), tick)
    assert "  tenant c: 3 turns -> 9 nodes, 12 edges in 0.5s" in out.getvalue().splitlines()


def test_eval_counter_prints_one_line_per_strategy_off_a_terminal():
    out, tick = io.StringIO(), Tick()
    count = CountProgress(stream=out, tty=False, now=tick)
    for i in range(1, 5):
        tick.t = i
        count("bm25", i, 4)
    assert out.getvalue().splitlines() == ["  bm25 4/4  1.0/s  in 4.0s"]


# a line of Ray's C++ logging, and of Ray's Python logging at INFO (Ray Data's plan and progress dumps)
NATIVE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+ [DIWEF] \d+ \d+\]", re.M)
RAY_INFO = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+\tINFO ", re.M)


@pytest.mark.ray
def test_a_build_into_a_file_prints_its_phases_and_none_of_rays_lines(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    log = tmp_path / "build.log"
    with log.open("w") as out:  # stdout and stderr: a file, not a terminal
        proc = subprocess.run([sys.executable, "-m", "jobs.cli", "build", "--input", str(SAMPLE), "--format", "jsonl",
                               "--out", str(tmp_path / "store"), "--num-cpus", "2"], env=env, cwd=ROOT,
                              stdout=out, stderr=subprocess.STDOUT, timeout=600)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    lines = text.splitlines()
    assert lines[0].startswith("read: 4 tenant(s) in ") and lines[0].endswith("starting Ray"), lines[:3]
    for prefix in ("ray: ", "tenants: blocks 1/1  tenants 4/4", "write: ", "index: ", "publish: ",
                   "published v000001"):
        assert sum(ln.startswith(prefix) for ln in lines) == 1, (prefix, text)
    assert "core_worker" not in text and not NATIVE.search(text), text
    assert not RAY_INFO.search(text) and "Started a local Ray instance" not in text, text
    assert "\r" not in text and "Progress bars disabled" not in text, text


def test_the_stderr_filter_drops_rays_native_lines_and_keeps_the_rest(tmp_path):
    """A process with the filter installed: Ray's C++ log lines on fd 2 are dropped, every other
    line (and a traceback printed as the process dies) reaches stderr."""
    script = ("import os, sys\nfrom jobs.ray_logs import hide_native_lines\nhide_native_lines()\n"
              "os.write(2, b'[2026-11-28 00:19:21,551 E 10562 10562] core_worker.cc:2465: Actor with class name: "
              "x has constructor arguments in the object store and max_restarts > 0.\\n')\n"
              "os.write(2, b'a line of our own\\n')\nprint('to stdout', flush=True)\n"
              "raise SystemExit('a last word on stderr')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1 and proc.stdout == "to stdout\n", proc
    assert proc.stderr == "a line of our own\na last word on stderr\n", proc.stderr
