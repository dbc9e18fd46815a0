"""Every ``memlib …`` command line of the README runs as written, on the bundled sample, in a
fresh directory, in README order: so the README cannot name a flag, a file or an order
of steps that does not work. Run in a child process each, as a user types them.

Not run, only checked against their ``--help`` (every flag they use must be listed there):
``memlib serve --store …`` and ``memlib mcp …`` (servers that run until stopped; the service's
own tests start them), and the LLM build without ``--dry-run`` (it needs an LLM endpoint)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[2]
SAMPLE_REL = "memlib/data/sample_conversations.jsonl"


def readme_command_lines() -> list[list[str]]:
    """The argv (after ``memlib``) of every memlib line of the README's bash blocks, continuation
    lines joined, comments dropped."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] in (".venv/bin/memlib", "memlib"):
                out.append(words[1:])
    return out


def not_run(args: list[str]) -> str | None:
    """Why a README line is only checked against --help (None: it is run)."""
    if args[0] == "mcp" or (args[0] == "serve" and "hash-token" not in args):
        return "a server that runs until stopped"
    if "--extractor" in args and "llm" in args and "--dry-run" not in args:
        return "needs an LLM endpoint"
    return None


def memlib(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def command_of(args: list[str]) -> list[str]:
    """The command (and subcommand) part of a line: what `--help` is asked of."""
    return args[:2] if args[:2] == ["serve", "hash-token"] else args[:1]


def test_the_readme_names_the_commands_a_newcomer_needs():
    commands = {a[0] for a in readme_command_lines()}
    assert {"inspect", "build", "query", "eval", "serve", "mcp"} <= commands
    assert any("--delete" in a and "--input" not in a for a in readme_command_lines())


def test_every_readme_command_line_runs(tmp_path):
    (tmp_path / "forget.txt").write_text("raj\n", encoding="utf-8")
    ran, checked = [], []
    for args in readme_command_lines():
        args = [str(ROOT / SAMPLE_REL) if a == SAMPLE_REL else a for a in args]
        helptext = memlib([*command_of(args), "--help"], tmp_path, timeout=120)
        assert helptext.returncode == 0, helptext.stderr
        for flag in (a.split("=", 1)[0] for a in args if a.startswith("--")):
            assert flag in helptext.stdout, f"README: `memlib {' '.join(args)}`: {flag} not in --help"
        if not_run(args):
            checked.append(args)
            continue
        res = memlib(args, tmp_path)
        assert res.returncode == 0, f"memlib {' '.join(args)}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
        assert "Traceback" not in res.stderr
        ran.append(args)
    assert len(ran) >= 8 and len(checked) >= 3
    assert (tmp_path / "store" / "manifest.json").is_file() and (tmp_path / "eval" / "metrics.json").is_file()


def all_options() -> set[str]:
    """Every option name of every memlib command and subcommand."""
    import typer

    from jobs.cli import app

    names: set[str] = set()
    stack = [typer.main.get_command(app)]
    while stack:
        cmd = stack.pop()
        names.update(o for p in cmd.params for o in (*p.opts, *p.secondary_opts))
        stack.extend(getattr(cmd, "commands", {}).values())  # a group's commands (typer's own click)
    return names


def test_every_flag_the_readme_names_exists():
    """The flags of the README's prose too (`--input-is-complete`, `--rollback`, …), not only those
    of its command lines."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    named = {m for code in re.findall(r"`([^`]+)`", text) for m in re.findall(r"(?<![\w-])--[a-z][a-z-]*", code)}
    assert named and sorted(named - all_options()) == []
