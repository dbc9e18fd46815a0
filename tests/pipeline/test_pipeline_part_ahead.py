"""A tenant alone in its row has its part's files written ahead (pipelines/tenant_part.py
``PartAhead``): the same bytes as the row's part written at once, a failed write failing the part,
and nothing left of a tenant that failed."""
from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pyarrow as pa
import pytest

from memlib import schema

DIM = 4


def _value(field: pa.Field, i: int, tenant: str):
    t = field.type
    if field.name == "tenant_id":
        return tenant
    if field.name == "kind":
        return "turn" if i % 2 else "fact"
    if pa.types.is_fixed_size_list(t):
        return [0.25 * (i + 1)] * t.list_size
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_value(pa.field(field.name, t.value_type), i, tenant)] if pa.types.is_string(t.value_type) else []
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return f"{field.name}-{i}"
    if pa.types.is_integer(t):
        return i
    if pa.types.is_floating(t):
        return 0.5 * i
    if pa.types.is_boolean(t):
        return bool(i % 2)
    return None


def _table(sch: pa.Schema, n: int, tenant: str) -> pa.Table:
    return pa.Table.from_pylist([{f.name: _value(f, i, tenant) for f in sch} for i in range(n)], schema=sch)


def _built(tenant: str) -> dict:
    nodes = _table(schema.nodes_schema(DIM), 5, tenant)
    tables = {name: _table(schema.TABLES[name], 3, tenant) for name in
              ("turns", "segments", "edges", "questions", "node_fallbacks", "token_sums", "matrix_refs",
               "node_importance")}
    return {**tables, "nodes": nodes, "lance_rows": nodes, "llm_calls": None, "graphs": {tenant: b"graph bytes"},
            "memory_graphs": {tenant: None}}


def _files(version_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(version_dir).as_posix(): p.read_bytes() for p in sorted(version_dir.rglob("*"))
            if p.is_file()}


def test_a_part_written_ahead_is_the_part_written_at_once(tmp_path):
    from pipelines.tenant_part import PartAhead, write_part

    built = _built("t1")
    at_once, ahead_dir = tmp_path / "a" / "versions" / "v3", tmp_path / "b" / "versions" / "v3"
    part, nodes_path = write_part(at_once, [built], DIM)
    ahead = PartAhead(ahead_dir, "t1")
    ahead.tables(built)
    ahead.staged_nodes(built["lance_rows"])
    ahead.turn_view(built["turns"], built["matrix_refs"])
    part_b, nodes_b = write_part(ahead_dir, [built], DIM, ahead)
    ahead.close()
    assert part_b == part and Path(nodes_b).relative_to(ahead_dir) == Path(nodes_path).relative_to(at_once)
    a, b = _files(at_once), _files(ahead_dir)
    assert "turns/" + part + ".parquet" in a and any(k.startswith("view_turns/") for k in a)
    assert list(a) == list(b) and all(a[k] == b[k] for k in a)


def test_a_failed_write_ahead_fails_the_part_and_a_failed_tenant_leaves_nothing(tmp_path):
    from pipelines.tenant_part import PartAhead, write_part

    built = _built("t1")
    ahead = PartAhead(tmp_path / "versions" / "v2", "t1")
    ahead.tables({**built, "edges": pa.table({"src": ["x"]})})  # not an edges table: its write raises
    with pytest.raises(Exception, match="edges"):
        write_part(tmp_path / "versions" / "v2", [built], DIM, ahead)
    ahead.close()

    gone = PartAhead(tmp_path / "versions" / "v4", "t1")
    gone.tables(built)
    gone.staged_nodes(built["lance_rows"])
    gone.discard()
    assert [p for p in (tmp_path / "versions" / "v4").rglob("*") if p.is_file()] == []


def test_a_summary_waits_for_its_digest_and_a_failed_digest_fails_its_tenant():
    from memlib.io.lance_checks import LANCE_DIGEST_KEY
    from pipelines.tenant_part import with_digest

    done, failed = Future(), Future()
    done.set_result({"nodes": [5, 7]})
    failed.set_exception(ValueError("bad rows"))
    assert with_digest({"tenant_id": "t", LANCE_DIGEST_KEY: done, "x": 1}) == \
        {"tenant_id": "t", LANCE_DIGEST_KEY: {"nodes": [5, 7]}, "x": 1}
    out = with_digest({"tenant_id": "t", LANCE_DIGEST_KEY: failed})
    assert out["tenant_id"] == "t" and "bad rows" in out["error"] and LANCE_DIGEST_KEY not in out
    assert with_digest({"tenant_id": "t", "error": "e"}) == {"tenant_id": "t", "error": "e"}
