"""A store version's tables are parts holding whole tenants: readers find a tenant through its
part, a nightly carry-over links whole parts and rewrites partly rebuilt ones, and a store
written before parts (a file per tenant) still reads and carries over."""
from __future__ import annotations

import os

import pyarrow as pa

from memlib import schema
from memlib.io.store import StoreReader, StoreWriter, part_id


def _turns(tenant: str, n: int) -> pa.Table:
    rows = [dict(tenant_id=tenant, conversation_id=f"{tenant}-c", session_id="s1", session_index=0,
                 turn_id=f"s1:{i}", turn_index=i, node_id=f"{tenant}-{i}", speaker="A", role="user",
                 text=f"{tenant} says {i}", content_hash=f"h{i}") for i in range(n)]
    return schema.conform(pa.Table.from_pylist(rows), schema.TURNS, name="turns")


def _publish(w: StoreWriter, parts: dict[str, str], turns: dict[str, int],
             held: dict[str, list[str]] | None = None) -> StoreReader:
    w.publish({"tenants": {t: {"part": p, "turns": turns[t]} for t, p in parts.items()}, "part_tenants": held or {}})
    return StoreReader(w.path)


def _write_part(w: StoreWriter, tenants: list[str], n: int = 3) -> str:
    part = part_id(tenants, w.version)
    w.write_table("turns", part, pa.concat_tables([_turns(t, n) for t in tenants]))
    w.write_graphs(part, {t: f"graph of {t}".encode() for t in tenants})
    return part


def test_a_tenant_is_read_from_its_part_alone(tmp_path):
    w = StoreWriter(tmp_path / "s", dim=8)
    p1, p2 = _write_part(w, ["a", "b", "c"]), _write_part(w, ["d"])
    r = _publish(w, {"a": p1, "b": p1, "c": p1, "d": p2}, dict.fromkeys("abcd", 3))
    assert r.table("turns", "b").column("tenant_id").to_pylist() == ["b"] * 3
    assert r.table("turns", "b", columns=["text"]).column_names == ["text"]
    assert r.table("turns").num_rows == 12 and r.parts() == {p1: ["a", "b", "c"], p2: ["d"]}
    assert r.graph_bytes("c") == b"graph of c" and r.graph_bytes("zz") is None
    assert len(list((r.version_dir / "turns").iterdir())) == 2  # files follow parts, not tenants


def test_carry_over_links_parts_and_compacts_half_dead_ones(tmp_path):
    """A part holding carried tenants is linked; its rebuilt or removed tenants' rows stay in it,
    dead, and no reader sees them; a part that would be more than half dead is compacted."""
    w = StoreWriter(tmp_path / "s", dim=8)
    p1, p2, p3 = _write_part(w, ["a", "b", "c"]), _write_part(w, ["d", "e", "g"]), _write_part(w, ["f"])
    sizes = dict.fromkeys("abcdefg", 3)
    r1 = _publish(w, {"a": p1, "b": p1, "c": p1, "d": p2, "e": p2, "g": p2, "f": p3}, sizes)
    # next run: b rebuilt, e and g removed; a, c, d, f carried
    w2 = StoreWriter(tmp_path / "s", dim=8)
    carried = w2.carry_over(["a", "c", "d", "f"], part_turns=100)
    linked = lambda p: os.stat(w2.version_dir / "turns" / f"{p}.parquet").st_ino == \
        os.stat(r1.version_dir / "turns" / f"{p}.parquet").st_ino  # noqa: E731
    assert carried.parts["a"] == carried.parts["c"] == p1 and linked(p1)  # 2 of its 3 tenants live: linked
    assert carried.parts["f"] == p3 and linked(p3) and carried.held[p1] == ["a", "b", "c"] and carried.held[p3] == ["f"]
    assert carried.parts["d"] not in (p1, p2, p3) and carried.held[carried.parts["d"]] == ["d"]  # 1 of 3: compacted
    pb = _write_part(w2, ["b"], n=5)
    parts = {**carried.parts, "b": pb}
    w2.prune_parts(parts)
    r2 = _publish(w2, parts, {**sizes, "b": 5}, {**carried.held, pb: ["b"]})
    assert r2.table("turns", "a").equals(r1.table("turns", "a"))
    assert r2.table("turns", "b").num_rows == 5 and r2.table("turns", "e").num_rows == 0
    assert sorted(set(r2.table("turns").column("tenant_id").to_pylist())) == ["a", "b", "c", "d", "f"]
    assert r2.table("turns").num_rows == 4 * 3 + 5  # b's old rows are in p1 still, dead: no reader sees them
    assert r2.table("turns", columns=["text"]).num_rows == 17
    assert r2.table("questions").num_rows == 0 and r2.table("edges", columns=["kind"]).num_rows == 0  # no such files
    assert r2.graph_bytes("d") == b"graph of d" and r2.graph_bytes("e") is None and r2.graph_bytes("b") == b"graph of b"


def test_a_part_holding_a_purged_tenant_is_compacted_whatever_its_live_share(tmp_path):
    """A deleted or forgotten tenant's rows may not stay even dead: any part holding them, live or
    dead, is rewritten without them."""
    w = StoreWriter(tmp_path / "s", dim=8)
    tenants = [f"t{i}" for i in range(6)]
    p = _write_part(w, tenants)
    _publish(w, dict.fromkeys(tenants, p), dict.fromkeys(tenants, 3), {p: tenants})
    w2 = StoreWriter(tmp_path / "s", dim=8)
    carried = w2.carry_over(tenants[1:], part_turns=100, purge={"t0"})  # t0 forgotten: 5 of 6 live
    new = carried.parts["t1"]
    assert new != p and carried.held == {new: tenants[1:]}
    import pyarrow.parquet as pq

    held = set(pq.read_table(w2.version_dir / "turns" / f"{new}.parquet").column("tenant_id").to_pylist())
    assert held == set(tenants[1:])  # no row of t0 on disk in this version


def test_remnants_are_packed_into_parts_of_bounded_turns(tmp_path):
    w = StoreWriter(tmp_path / "s", dim=8)
    tenants = [f"t{i}" for i in range(10)]
    p = _write_part(w, tenants)
    _publish(w, dict.fromkeys(tenants, p), dict.fromkeys(tenants, 3))
    w2 = StoreWriter(tmp_path / "s", dim=8)
    carried = w2.carry_over(tenants[1:], part_turns=9)  # t0 rebuilt: nine of ten live, the part is linked
    assert set(carried.parts.values()) == {p} and carried.held == {p: tenants}
    _publish(w2, carried.parts, dict.fromkeys(tenants, 3), carried.held)
    w3 = StoreWriter(tmp_path / "s", dim=8)
    carried = w3.carry_over(tenants[6:], part_turns=9)  # 4 of 10 live: compacted, three turns a tenant
    assert len(set(carried.parts.values())) == 2 and p not in carried.parts.values()
    assert sorted(map(len, carried.held.values())) == [1, 3]


def test_a_store_written_before_parts_reads_and_is_packed_by_the_next_build(tmp_path):
    """No part in the manifest: a tenant is its own part (turns/<tenant>.parquet, graphs/<tenant>.gt);
    the next build carries its tenants into parts (the store is upgraded as it goes)."""
    w = StoreWriter(tmp_path / "s", dim=8)
    for t in ("old1", "old2"):
        w.write_table("turns", t, _turns(t, 2))
        w.graph_path(t).write_bytes(f"gt {t}".encode())
    w.publish({"tenants": {"old1": {"turns": 2}, "old2": {"turns": 2}}})
    r = StoreReader(w.path)
    assert r.part_of("old1") == "old1" and r.table("turns", "old1").num_rows == 2
    assert r.graph_bytes("old2") == b"gt old2" and r.graph_file("old2").suffix == ".gt"
    w2 = StoreWriter(tmp_path / "s", dim=8)
    parts = w2.carry_over(["old1", "old2"]).parts
    assert parts["old1"] == parts["old2"] and parts["old1"].startswith("part-")
    r2 = _publish(w2, parts, {"old1": 2, "old2": 2})
    assert r2.table("turns", "old1").equals(r.table("turns", "old1")) and r2.graph_bytes("old2") == b"gt old2"
    assert sorted(p.name for p in (r2.version_dir / "turns").iterdir()) == [f"{parts['old1']}.parquet"]
    assert not list((r2.version_dir / "graphs").glob("*.gt"))


def test_a_part_has_a_row_group_per_tenant_and_one_tenant_reads_only_its_own(tmp_path):
    """A part's Parquet file holds one row group per tenant (rows kept in order within each), so
    reading one tenant opens its row group alone; a file of an earlier layout (one row group for
    every tenant) reads the same rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from memlib.io.files import read_tenant, replace_part

    rows = [{"tenant_id": t, "i": i} for i, t in enumerate(["b", "a", "c", "a", "b", "a"])]
    table = pa.Table.from_pylist(rows)
    part = replace_part(table, tmp_path / "part.parquet")
    meta = pq.ParquetFile(part).metadata
    assert meta.num_row_groups == 3
    assert [meta.row_group(g).column(0).statistics.min for g in range(3)] == ["a", "b", "c"]
    assert read_tenant(part, "a").column("i").to_pylist() == [1, 3, 5]
    assert read_tenant(part, "b", ["i"]).column_names == ["i"]
    assert read_tenant(part, "zed").num_rows == 0
    pq.write_table(table, tmp_path / "old.parquet")  # an earlier layout: one row group
    for tenant in "abc":
        assert read_tenant(tmp_path / "old.parquet", tenant).equals(read_tenant(part, tenant))
    assert sorted(pq.read_table(part).to_pylist(), key=lambda r: r["i"]) == rows  # nothing lost or added
