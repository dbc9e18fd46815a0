"""`memlib build` end to end on a tiny three-tenant input (local Ray, 2 CPUs)."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from memlib import schema
from memlib.io.store import StoreReader
from tests.pipeline.conftest import SESSIONS, run_cli

pytestmark = pytest.mark.ray


def _reader(store: Path) -> StoreReader:
    return StoreReader(store)


def test_every_table_matches_its_schema(built_store):
    r = _reader(built_store)
    for name in ("turns", "segments", "edges", "questions", "quarantine"):
        t = r.table(name)
        schema.check(t, schema.TABLES[name], name=name)
        assert t.num_rows > 0, name
    nodes = r.nodes()
    schema.check(nodes, schema.nodes_schema(r.dim), name="nodes")
    kinds = set(nodes.column("kind").to_pylist())
    assert {"turn", "session", "segment", "clue", "fact", "concept", "entity"} <= kinds


def test_all_tenants_nodes_go_to_lance_in_one_commit(built_store):
    """The three tenants (small ones, built in one row of the tenant operator) are written to each
    Lance table by one add: one data fragment, not one per tenant."""
    from memlib.io.store import lance_shape

    assert {k: v["fragments"] for k, v in lance_shape(built_store).items()} == {"nodes": 1, "turn_text": 1}
    assert sorted(set(_reader(built_store).nodes(columns=["tenant_id"]).column("tenant_id").to_pylist())) == \
        sorted(SESSIONS)


def test_every_edge_endpoint_exists_and_nothing_was_dropped(built_store):
    r = _reader(built_store)
    ids = set(r.nodes(columns=["node_id"]).column("node_id").to_pylist())
    edges = r.edges()
    assert set(edges.column("src").to_pylist()) <= ids
    assert set(edges.column("dst").to_pylist()) <= ids
    assert r.manifest["dropped_edges_by_kind"] == {}


def test_every_fact_derives_from_an_existing_turn(built_store):
    r = _reader(built_store)
    nodes = pl.from_arrow(r.nodes(columns=["node_id", "kind"]))
    facts = set(nodes.filter(pl.col("kind") == "fact")["node_id"])
    turns = set(r.table("turns").column("node_id").to_pylist())
    edges = pl.from_arrow(r.edges()).filter(pl.col("kind") == "DERIVED_FROM")
    derived = edges.filter(pl.col("src").is_in(list(facts)))
    assert facts and facts == set(derived["src"])
    assert set(derived["dst"]) <= turns


def test_next_chains_each_session_in_order(built_store):
    r = _reader(built_store)
    turns = pl.from_arrow(r.table("turns")).sort(["tenant_id", "session_index", "turn_index"])
    nxt = pl.from_arrow(r.edges()).filter(pl.col("kind") == "NEXT").select("src", "dst")
    expected = (turns.with_columns(pl.col("node_id").shift(-1).over(["tenant_id", "session_id"]).alias("dst"))
                .filter(pl.col("dst").is_not_null()).select(pl.col("node_id").alias("src"), "dst"))
    assert sorted(nxt.rows()) == sorted(expected.rows())
    n_sessions = sum(len(s) for s in SESSIONS.values())
    assert nxt.height == turns.height - n_sessions


def test_malformed_records_are_quarantined(built_store):
    r = _reader(built_store)
    q = r.table("quarantine")
    assert q.num_rows == 2
    assert r.manifest["row_counts"]["quarantine"] == 2
    assert r.table("turns").num_rows == sum(len(t) for s in SESSIONS.values() for _, t in s)


def test_manifest_records_inputs_counts_and_timings(built_store):
    m = json.loads((built_store / "manifest.json").read_text())
    assert sorted(m["tenants"]) == sorted(SESSIONS)
    assert all(len(v["input_hash"] or "") >= 16 for v in m["tenants"].values())
    assert m["row_counts"]["nodes"] == sum(m["nodes_by_kind"].values())
    assert m["row_counts"]["edges"] == sum(m["edges_by_kind"].values())
    assert {"read", "tenants", "write", "index", "total"} <= set(m["stage_timings_s"])
    assert all("graph" in t for t in m["tenant_timings_s"].values())  # graphs are built by the tenant stage
    assert m["config"]["embed"]["dim"] == 384 and m["memlib_version"]
    assert m["graph"]["status"] == "built"
    assert all(_reader(built_store).graph_bytes(t) is not None for t in SESSIONS)


def test_importance_is_filled_from_the_graph(built_store):
    imp = _reader(built_store).nodes(columns=["importance"]).column("importance")
    assert imp.null_count == 0
    assert pa.compute.max(imp).as_py() > 0


def test_tables_readable_without_memlib(built_store):
    import duckdb

    vdir = built_store / "versions" / json.loads((built_store / "manifest.json").read_text())["version"]
    edges = pl.read_parquet(vdir / "edges" / "*.parquet")
    assert edges.height > 0
    n = duckdb.sql(f"select count(*) from read_parquet('{vdir}/turns/*.parquet')").fetchall()[0][0]
    assert n == sum(len(t) for s in SESSIONS.values() for _, t in s)
    import lancedb  # the nodes table is a plain Lance table

    assert lancedb.connect(str(built_store / "lance")).open_table("nodes").count_rows() > 0


def test_second_build_gives_identical_ids(built_store, tiny_input, tmp_path):
    out = tmp_path / "again"
    result = run_cli(["build", "--input", str(tiny_input), "--format", "jsonl", "--out", str(out)])
    assert result.exit_code == 0, result.output
    a, b = _reader(built_store), _reader(out)
    ids_a = sorted(a.nodes(columns=["node_id"]).column("node_id").to_pylist())
    ids_b = sorted(b.nodes(columns=["node_id"]).column("node_id").to_pylist())
    assert ids_a == ids_b
    ea = pl.from_arrow(a.edges().select(["src", "dst", "kind"])).sort(["src", "dst", "kind"])
    eb = pl.from_arrow(b.edges().select(["src", "dst", "kind"])).sort(["src", "dst", "kind"])
    assert ea.equals(eb)


def test_unreadable_input_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("this is not json", encoding="utf-8")
    result = run_cli(["build", "--input", str(bad), "--format", "locomo", "--out", str(tmp_path / "s")])
    assert result.exit_code == 2
    assert "error:" in result.output and "Traceback" not in result.output
    missing = run_cli(["build", "--input", str(tmp_path / "nope.jsonl"), "--format", "jsonl",
                       "--out", str(tmp_path / "s")])
    assert missing.exit_code == 2
