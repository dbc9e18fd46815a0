"""The command line's help tells the truth: ``memlib --version``; defaults shown as
values (with the setting that changes them), not as config key names; ``--strategy`` lists the
registry's strategies; an incremental run's summary does not read like a full build's; --compact
says what it removed in words, not as a Python dict."""
from __future__ import annotations

import re

from typer.testing import CliRunner

from jobs.cli import app
from jobs.cli.cmd_build import compact_lines, format_summary
from jobs.cli.common import STRATEGY_NAMES


def cli(*args: str) -> str:
    res = CliRunner().invoke(app, list(args), env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())


def test_version():
    import memlib

    assert cli("--version").strip() == f"memlib {memlib.__version__}"


def test_defaults_are_values():
    query = cli("query", "--help")
    assert "default: auto (retrieve.default_strategy)" in query and "default: 10 (retrieve.k)" in query
    assert "default: 127.0.0.1 (serve.host)" in cli("serve", "--help")
    assert "default: 1,3,5,10,20 (eval.ks)" in cli("eval", "--help")
    for command in ("query", "serve", "eval", "build", "inspect"):
        assert not re.search(r"default: [a-z_]+\.[a-z_]+\)", cli(command, "--help")), command


def test_strategy_lists_the_registry():
    from memlib.retrieve.registry import list_strategies

    assert sorted(STRATEGY_NAMES) == sorted(list_strategies())
    assert " | ".join(STRATEGY_NAMES) in cli("query", "--help")


def test_build_help_says_a_directory_needs_no_incremental():
    text = cli("build", "--help")
    assert "with --incremental" not in text.split("--format")[0] and "input file or directory of files" in text


def test_an_incremental_summary_names_what_was_built_and_carried():
    manifest = {"version": "v000002", "recipe": "full", "tenants": {"a": {}, "b": {}},
                "row_counts": {"turns": 1, "questions": 0, "nodes": 1, "edges": 0, "quarantine": 0},
                "nodes_by_kind": {}, "edges_by_kind": {}, "quarantine_by_reason": {}, "stage_timings_s": {},
                "tenant_stage_timings_s": {},
                "incremental": {"built": ["a"], "carried": ["b"], "resumed": [], "deleted": [], "failed": {}}}
    first = format_summary(manifest).splitlines()[0]
    assert first == "store version v000002 (build recipe full; tenants: 1 built, 1 carried)"


def test_compact_says_what_it_removed_in_words():
    text = compact_lines({"lance_versions_before": 3, "removed_versions": ["v000001"], "version": "v000002",
                          "lance_version": 4, "lance_versions_after": 1, "llm_cache_removed": 0,
                          "token_matrices_removed": 2})
    assert "{" not in text and text.splitlines() == [
        "compacted v000002: removed 1 older version(s) (v000001); Lance versions 3 -> 1",
        "  caches: llm cache removed 0, token matrices removed 2"]
