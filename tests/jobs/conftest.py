"""Fixtures of the jobs area: a small generic-JSONL input written here (four tenants, two of
them with two conversations), a CLI runner, and helpers that read every table of a store."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

TOPICS = {
    "dora": [("dora-a", "I repaired the old sailboat Marigold with my uncle in Bergen harbour."),
             ("dora-b", "My secret lasagne recipe uses smoked paprika and nutmeg from Zanzibar.")],
    "emil": [("emil-a", "I am learning to play the bandoneon for a tango festival in Rosario.")],
    "fay": [("fay-a", "Our team shipped the payroll migration to the Helsinki datacenter on Friday."),
            ("fay-b", "I keep bees on the roof and harvested eleven jars of linden honey.")],
    "gus": [("gus-a", "My daughter Nilla won the regional chess final with a queen sacrifice.")],
}


def tenant_lines(tenant: str, variant: str = "") -> list[str]:
    lines = []
    for ci, (conv, fact) in enumerate(TOPICS[tenant]):
        for si in range(1, 3):
            when = f"2023-0{ci + 1}-1{si}T10:00:00+00:00"
            texts = [fact + variant, "That sounds wonderful, tell me more.",
                     f"Session {si}: {fact.lower()} It took a lot of patience.", "Thanks for sharing!"]
            for ti, text in enumerate(texts, start=1):
                role = "user" if ti % 2 else "assistant"
                lines.append(json.dumps({"tenant_id": tenant, "conversation_id": conv, "session_id": f"s{si}",
                                         "session_time": when, "turn_id": f"s{si}:{ti}",
                                         "speaker": tenant.title() if role == "user" else "Bot",
                                         "role": role, "text": text}))
    return lines


def write_jsonl(path: Path, tenants: list[str], variants: dict[str, str] | None = None) -> Path:
    variants = variants or {}
    lines = [ln for t in tenants for ln in tenant_lines(t, variants.get(t, ""))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_cli(args: list[str]):
    from typer.testing import CliRunner

    from jobs.cli import app

    return CliRunner().invoke(app, args)


def published_text(store: Path) -> str:
    """Every string of every table of the published version, joined (Lance at the pinned version,
    all Parquet tables, graph files as raw bytes decoded leniently)."""
    from memlib.io.store import PARQUET_TABLES, StoreReader

    r = StoreReader(store)
    parts = []
    nodes = r.nodes(columns=[c for c in r.nodes_table().schema.names if c != "embedding"])
    parts.append(_strings(nodes))
    for name in PARQUET_TABLES:
        parts.append(_strings(r.table(name)))
    for tenant in r.tenants():
        graph = r.graph_bytes(tenant)
        if graph is not None:
            parts.append(graph.decode("latin-1"))
    return "\n".join(parts)


def _strings(t: pa.Table) -> str:
    out = []
    for col in t.columns:
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            out.extend(v for v in col.to_pylist() if v)
        elif pa.types.is_list(col.type):
            out.extend(str(v) for v in col.to_pylist() if v)
    return "\n".join(out)


@pytest.fixture()
def jobs_env(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


ALL = ["dora", "emil", "fay", "gus"]


@pytest.fixture(scope="session")
def base_store(ray_local, tmp_path_factory) -> tuple[Path, Path]:
    """(input file, store) of a first `memlib build --incremental` of all four tenants."""
    d = tmp_path_factory.mktemp("jobs_base")
    inp = write_jsonl(d / "in.jsonl", ALL)
    store = d / "store"
    res = run_cli(["build", "--incremental", "--input", str(inp), "--format", "jsonl", "--out", str(store),
                   "--num-cpus", "2"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    return inp, store


def node_rows(store: Path, manifest: dict | None = None) -> list[tuple]:
    from memlib.io.store import StoreReader

    t = StoreReader(store, manifest).nodes(columns=["node_id", "tenant_id", "kind", "text"])
    return sorted(zip(*(t.column(c).to_pylist() for c in ("node_id", "tenant_id", "kind", "text"))))


# the store the fault-injection suites damage (copied per case): the bundled sample built once for
# the session, with the token matrices and small blocks that give each tenant several kept blocks
FAULT_BUILD = ["--set", "embed.backend=wordllama", "--set", "embed.dim=256",
               "--set", "retrieve.precompute_token_matrices=true", "--set", "ray.block_turns=40"]


@pytest.fixture(scope="session")
def fault_store(tmp_path_factory) -> Path:
    from tests.serve.conftest import build_sample

    return build_sample(tmp_path_factory.mktemp("fault_store") / "store", *FAULT_BUILD)
