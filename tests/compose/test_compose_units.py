"""Unit tests of the build composition helpers (no Ray, no model)."""
from __future__ import annotations

import pyarrow as pa
import pytest

from memlib import schema
from memlib.compose.finalize import finalize
from memlib.compose.recipe import RECIPES, Step, UnknownRecipeError, get_recipe


def _nodes(ids):
    return pa.table({"node_id": ids, "tenant_id": ["t"] * len(ids), "kind": ["turn"] * len(ids),
                     "text": ids, "embedding": pa.array([[0.0] * 4] * len(ids), pa.list_(pa.float32(), 4))})


def test_finalize_drops_and_counts_dangling_edges_and_dedups():
    nodes = _nodes(["a", "b", "a"])
    edges = pa.table({"tenant_id": ["t"] * 4, "src": ["a", "a", "a", "b"], "dst": ["b", "b", "ghost", "a"],
                      "kind": ["NEXT", "NEXT", "MENTIONS", "SIMILAR"]})
    done = finalize(nodes, edges, 4)
    assert done.nodes.column("node_id").to_pylist() == ["a", "b"]
    assert done.edges.num_rows == 2
    assert done.dropped_edges == 1 and done.dropped_by_kind == {"MENTIONS": 1}
    schema.check(done.nodes, schema.nodes_schema(4))
    schema.check(done.edges, schema.EDGES)


def test_recipes_are_ordered_and_complete():
    for name in RECIPES:
        stages = get_recipe(name)
        order = list(Step)
        assert [order.index(s) for s in stages] == sorted(order.index(s) for s in stages)
        assert Step.EMBED_TURNS in stages and Step.FINALIZE in stages
    assert get_recipe("full") == tuple(Step)
    with pytest.raises(UnknownRecipeError):
        get_recipe("nope")


def test_documented_defaults_file_matches_builtin_defaults():
    from memlib.config import DEFAULT_FILE, MemlibConfig, load_config

    assert load_config(DEFAULT_FILE, environ={}) == MemlibConfig()


def test_turn_vectors_read_back_as_views_of_a_chunked_sliced_table():
    """Kept turn vectors come back as numpy views of the Arrow buffers (no per-turn copy), right
    for a table of several chunks read from an offset."""
    import numpy as np

    from memlib.compose.vectors import TOKEN_DIM, TurnVectors

    rng = np.random.default_rng(0)
    sizes = [3, 0, 5, 1, 4, 2]
    ids = [rng.integers(1000, 3000, n).astype(np.int32) for n in sizes]
    vecs = [rng.normal(size=(n, TOKEN_DIM)).astype(np.float16) for n in sizes]
    whole = TurnVectors([f"t{i}" for i in range(len(sizes))], rng.normal(size=(len(sizes), 8)).astype(np.float32),
                        ids, vecs).table([f"k{i}" for i in range(len(sizes))], ["x"] * len(sizes), 8)
    table = pa.concat_tables([whole.slice(0, 2), whole.slice(2, 4)]).slice(1, 4)  # 2 chunks, offset 1
    back = TurnVectors.from_table(table)
    assert back.node_ids == ["t1", "t2", "t3", "t4"]
    for i, j in enumerate(range(1, 5)):
        assert np.array_equal(back.token_ids[i], ids[j]) and np.array_equal(back.token_vectors[i], vecs[j])
        assert back.token_vectors[i].shape == (sizes[j], TOKEN_DIM)


def test_session_index_refresh_reads_only_new_files_and_never_a_file_being_written(tmp_path, monkeypatch):
    """A refresh re-reads only index files added or rewritten since the last read; a file still
    being written (its temporary name starts with ".") is never listed."""
    from pathlib import Path

    import pyarrow.parquet as pq

    from memlib.compose import session_store as ss

    store = ss.SessionStore(tmp_path, "k")
    idir = store.root / "index"

    def entry(block: str, keys: list[str]) -> None:
        rows = {"session_key": keys, "tenant_id": ["t"] * len(keys), "turns": pa.array([1] * len(keys), pa.int32())}
        ss._write(pa.table(rows, schema=ss.INDEX), idir / f"{block}.parquet")

    entry("b1", ["s1", "s2"])
    entry("b2", ["s3"])
    reads: list[str] = []
    real = pq.read_table
    monkeypatch.setattr(ss.pq, "read_table", lambda f, *a, **k: (reads.append(Path(f).stem), real(f, *a, **k))[1])
    assert sorted(store.index().column("session_key").to_pylist()) == ["s1", "s2", "s3"]
    assert sorted(reads) == ["b1", "b2"]
    reads.clear()
    entry("b3", ["s4"])
    pq.write_table(pa.table({"session_key": ["half"]}), idir / ".tmp-99-b4.parquet")  # another worker's write
    store.refresh()
    assert store.known(["s1", "s4", "half"]) == {"s1", "s4"} and reads == ["b3"]
    reads.clear()
    entry("b1", ["s1"])  # rewritten without s2 (retain/rewrite), b2 dropped
    (idir / "b2.parquet").unlink()
    store.refresh()
    assert sorted(store.index().column("session_key").to_pylist()) == ["s1", "s4"] and reads == ["b1"]


def test_kept_turn_vectors_are_memory_mapped_and_read_by_session(tmp_path):
    """A block's turn vectors are an Arrow IPC file read back without a copy: the token vectors of
    the sessions asked for are views of the mapped file; a rewrite without a session drops it."""
    import numpy as np

    from memlib.compose import session_store as ss
    from memlib.compose.sessions import SessionOutput
    from memlib.compose.vectors import TOKEN_DIM, TurnVectors

    rng = np.random.default_rng(1)
    sizes, keys = [2, 3, 0, 4], ["s1", "s2", "s2", "s3"]
    tv = TurnVectors([f"t{i}" for i in range(4)], rng.normal(size=(4, 8)).astype(np.float32),
                     [rng.integers(1000, 2000, n).astype(np.int32) for n in sizes],
                     [rng.normal(size=(n, TOKEN_DIM)).astype(np.float16) for n in sizes])
    store = ss.SessionStore(tmp_path, "k", dim=8)
    index = pa.table({"session_key": ["s1", "s2", "s3"], "tenant_id": ["x"] * 3,
                      "turns": pa.array([1, 2, 1], pa.int32())})
    store.write_block("b1", SessionOutput({}), tv.table(keys, ["x"] * 4, 8), index)
    bdir = store.root / "blocks" / "b1"
    assert (bdir / "turn_vectors.arrow").exists() and not (bdir / "turn_vectors.parquet").exists()
    _, back = store.read(["s3", "s2"])
    assert back.node_ids == ["t1", "t2", "t3"]
    np.testing.assert_array_equal(back.vectors, tv.vectors[1:])
    for got, want in zip(back.token_vectors, tv.token_vectors[1:]):
        np.testing.assert_array_equal(got, want)
        assert not got.flags.owndata and not got.flags.writeable  # a view of the mapped file
    store._rewrite("b1", {"s1", "s3"})
    store.refresh()
    assert TurnVectors.from_table(ss._read_vectors(bdir / "turn_vectors.arrow")).node_ids == ["t0", "t3"]


@pytest.mark.heavy
def test_sessions_parsed_together_give_what_each_gives_alone(locomo_path):
    """A block's sessions go through spaCy in one call (memlib.extract.parse.parse_contexts):
    every kept table of every session equals what the session yields on its own."""
    import numpy as np

    from memlib.compose.recipe import get_recipe
    from memlib.compose.sessions import session_local, sessions_local, split_sessions
    from memlib.config import MemlibConfig
    from memlib.io.readers import read_input

    cfg, plan = MemlibConfig(), get_recipe("full")
    sessions = split_sessions(read_input(locomo_path, "locomo").turns)[:6]
    rng = np.random.default_rng(0)
    vectors = [rng.normal(size=(s.num_rows, cfg.embed.dim)).astype(np.float32) for s in sessions]
    together, nlp = sessions_local([(s, v, f"k{i}") for i, (s, v) in enumerate(zip(sessions, vectors))], cfg, plan)
    for i, (s, v) in enumerate(zip(sessions, vectors)):
        alone, nlp = session_local((s, v, f"k{i}"), cfg, plan, nlp)
        assert set(alone.tables) == set(together[i].tables)
        for name, table in alone.tables.items():
            assert table.equals(together[i].tables[name]), (i, name)
    assert sum(together[i].table("fact_drafts").num_rows for i in range(len(sessions))) > 0


def _turn_vectors(keys: list[str], dim: int = 8) -> pa.Table:
    import numpy as np

    from memlib.compose.vectors import TOKEN_DIM, TurnVectors

    rng = np.random.default_rng(2)
    tv = TurnVectors([f"t{i}" for i in range(len(keys))], rng.normal(size=(len(keys), dim)).astype(np.float32),
                     [rng.integers(1000, 2000, 3).astype(np.int32) for _ in keys],
                     [rng.normal(size=(3, TOKEN_DIM)).astype(np.float16) for _ in keys])
    return tv.table(keys, ["x"] * len(keys), dim)


def _one_block(root, dim: int = 8):
    from memlib.compose import session_store as ss
    from memlib.compose.sessions import SessionOutput

    store = ss.SessionStore(root, "k", dim=dim)
    index = pa.table({"session_key": ["s1"], "tenant_id": ["x"], "turns": pa.array([2], pa.int32())})
    store.write_block("b1", SessionOutput({}), _turn_vectors(["s1", "s1"], dim), index)
    return store.root / "blocks" / "b1" / "turn_vectors.arrow"


def _flip_keeping_mtime(path) -> None:
    import os

    st = os.stat(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # damage below the file system: same mtime


def test_a_builds_kept_blocks_are_hashed_only_when_written_since_and_verify_hashes_every_byte(tmp_path):
    """A block's checksums name each file's mtime at hashing: a build's store (``trust_unchanged``)
    trusts a file with that size and mtime without reading it, and hashes one written since; the
    service's store and ``verify`` hash every file (docs/decisions/0038-kept-blocks-by-mtime.md)."""
    from memlib.compose import session_store as ss
    from memlib.io import checksums

    path = _one_block(tmp_path)
    build = ss.SessionStore(tmp_path, "k", dim=8, trust_unchanged=True)
    build.index()
    assert all(len(e) == 3 for e in build._read["b1"][2].values())
    checksums.forget()
    _flip_keeping_mtime(path)  # same size, same mtime: what a build does not read again
    assert build.verify() == {}
    served = ss.SessionStore(tmp_path, "k", dim=8)
    assert "content checksum" in served.verify()["b1"]
    checksums.forget()
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))  # written since: hashed, found
    build = ss.SessionStore(tmp_path, "k", dim=8, trust_unchanged=True)
    build.index()
    assert "turn_vectors.arrow" in build.verify()["b1"]


def test_a_build_gives_blocks_kept_before_mtimes_their_mtime_once_their_bytes_are_checked(tmp_path):
    """A block whose checksums name no mtime (kept by an earlier version) is hashed in full, then
    ``record_mtimes`` rewrites its index file with the mtimes: the next build stats it only. A
    damaged one gets none."""
    import json

    import pyarrow.parquet as pq

    from memlib.compose import block_checks as bc
    from memlib.compose import session_store as ss
    from memlib.io import checksums

    path = _one_block(tmp_path)
    idx_file = tmp_path / ss.SESSIONS_SUBDIR / "k" / "index" / "b1.parquet"
    t = pq.read_table(idx_file)
    old = {n: e[:2] for n, e in json.loads(t.schema.metadata[bc.SUMS_KEY]).items()}
    pq.write_table(t.replace_schema_metadata({bc.SUMS_KEY: json.dumps(old).encode()}), idx_file)
    checksums.forget()
    build = ss.SessionStore(tmp_path, "k", dim=8, trust_unchanged=True)
    build.index()
    assert build.verify() == {} and build.record_mtimes(["b1"]) == 1
    build.refresh()
    build.index()
    assert all(len(e) == 3 for e in build._read["b1"][2].values())
    assert build.record_mtimes(["b1"]) == 0
    pq.write_table(t.replace_schema_metadata({bc.SUMS_KEY: json.dumps(old).encode()}), idx_file)
    checksums.forget()
    _flip_keeping_mtime(path)
    build = ss.SessionStore(tmp_path, "k", dim=8, trust_unchanged=True)
    build.index()
    assert "b1" in build.verify() and build.record_mtimes(["b1"]) == 0


def test_rows_in_session_order_move_only_the_rows_out_of_place():
    """A nightly's kept blocks come in session order but for a new session inside a kept block's
    range: the rows come out grouped by session in the tenant's order, within a session as read,
    as a full sort gives them."""
    import numpy as np

    from memlib.compose.reference import _in_session_order

    order = pa.array([f"s{i}" for i in range(6)], pa.string())
    for keys in (["s0", "s1", "s3", "s3", "s4", "s2", "s5"], ["s5", "s0", "s1"], ["s0", "s2", "s1", "s1", "s3"],
                 ["s0", "s1", "s2"], ["s9", "s1", "s0"]):
        t = pa.table({"session_key": keys, "row": list(range(len(keys)))})
        rank = [order.to_pylist().index(k) if k in order.to_pylist() else len(order) for k in keys]
        want = [t.column("row").to_pylist()[i] for i in np.argsort(rank, kind="stable")]
        assert _in_session_order(t, order).column("row").to_pylist() == want


def test_a_block_kept_with_parquet_session_tables_is_read_and_rewritten_as_it_is(tmp_path):
    """Blocks are written with Arrow IPC session tables (mapped when read); a block an earlier
    version kept with Parquet ones gives the same rows, is checked against its checksums, and a
    rewrite (hard deletion) keeps its format."""
    import pyarrow.parquet as pq

    from memlib.compose import session_store as ss
    from memlib.compose.sessions import SESSION_TABLES, SessionOutput

    _one_block(tmp_path)  # session s1 of tenant x
    store = ss.SessionStore(tmp_path, "k", dim=8)
    bdir = store.root / "blocks" / "b1"
    assert all((bdir / f"{n}.arrow").exists() and not (bdir / f"{n}.parquet").exists() for n in SESSION_TABLES)
    nodes = pa.table({"session_key": ["s1", "s2"], "node_id": ["n1", "n2"], "tenant_id": ["x", "x"],
                      "kind": ["turn", "turn"], "text": ["a", "b"]})
    out = SessionOutput({"nodes": ss.schema.conform(nodes, ss.keyed_schema("nodes"), name="nodes")})
    index = pa.table({"session_key": ["s1", "s2"], "tenant_id": ["x", "x"], "turns": pa.array([1, 1], pa.int32())})
    store.write_block("b2", out, _turn_vectors(["s1", "s2"]), index)
    b2 = store.root / "blocks" / "b2"
    want = store.read(["s1", "s2"], ["b2"])[0].table("nodes")
    for n in SESSION_TABLES:  # as an earlier version kept it
        pq.write_table(ss._read_table(b2 / f"{n}.arrow"), b2 / f"{n}.parquet")
        (b2 / f"{n}.arrow").unlink()
    store._commit("b2", ss.schema.conform(index, ss.INDEX, name="session_index"))
    old = ss.SessionStore(tmp_path, "k", dim=8)
    assert old.verify() == {}
    assert old.read(["s1", "s2"], ["b2"])[0].table("nodes").equals(want)
    old._rewrite("b2", {"s2"})
    assert (b2 / "nodes.parquet").exists() and not (b2 / "nodes.arrow").exists()
    old.refresh()
    assert old.read(["s2"], ["b2"])[0].table("nodes").column("node_id").to_pylist() == ["n2"]
    assert old.upgrade()["session_blocks_upgraded"] == 1  # memlib build --compact: the layout a build writes
    assert all((b2 / f"{n}.arrow").exists() and not (b2 / f"{n}.parquet").exists() for n in SESSION_TABLES)
    now = ss.SessionStore(tmp_path, "k", dim=8)
    assert now.verify() == {} and now.read(["s2"], ["b2"])[0].table("nodes").column("node_id").to_pylist() == ["n2"]


def test_kept_session_tables_are_one_batch_and_older_blocks_come_back_in_one_chunk(tmp_path):
    """A block's session tables are written as one record batch whatever the chunks of the outputs
    (one per session), and read back mapped, each column one chunk; a block kept before that (one
    batch per session) reads back the same values in one chunk, and the upgrade rewrites it as one
    batch (decision 0062)."""
    from memlib.compose import session_store as ss
    from memlib.compose.block_files import batches
    from memlib.compose.sessions import SESSION_TABLES, SessionOutput
    from memlib.io.files import replace_arrow

    store = ss.SessionStore(tmp_path, "k", dim=8)
    per_session = [pa.table({"session_key": [k, k], "node_id": [f"{k}a", f"{k}b"], "tenant_id": ["x", "x"],
                             "kind": ["turn", "turn"], "text": ["a", "b"]}) for k in ("s1", "s2", "s3")]
    nodes = ss.schema.conform(pa.concat_tables(per_session), ss.keyed_schema("nodes"), name="nodes")
    assert nodes.column("node_id").num_chunks == 3
    index = pa.table({"session_key": ["s1", "s2", "s3"], "tenant_id": ["x"] * 3,
                      "turns": pa.array([2] * 3, pa.int32())})
    store.write_block("b1", SessionOutput({"nodes": nodes}), _turn_vectors(["s1", "s2", "s3"]), index)
    bdir = store.root / "blocks" / "b1"
    assert batches(bdir / "nodes.arrow") == 1 and all(batches(bdir / f"{n}.arrow") <= 1 for n in SESSION_TABLES)
    read = store.read(["s1", "s2", "s3"], ["b1"])[0].table("nodes")
    assert read.equals(nodes) and {c.num_chunks for c in read.columns} == {1}
    replace_arrow(nodes, bdir / "nodes.arrow")  # as a build before 0062 kept it: a batch per session
    store._commit("b1", ss.schema.conform(index, ss.INDEX, name="session_index"))
    assert batches(bdir / "nodes.arrow") == 3
    old = ss.SessionStore(tmp_path, "k", dim=8)
    for keys in (["s1", "s2", "s3"], ["s1", "s3"]):
        got = old.read(keys, ["b1"])[0].table("nodes")
        assert {c.num_chunks for c in got.columns} == {1}
        assert got.column("node_id").to_pylist() == [f"{k}{x}" for k in keys for x in "ab"]
    assert old.upgrade() == {"session_blocks_upgraded": 1, "session_blocks_not_upgraded": 0}
    assert batches(bdir / "nodes.arrow") == 1
    now = ss.SessionStore(tmp_path, "k", dim=8)
    assert now.verify() == {} and now.read(["s1", "s2", "s3"], ["b1"])[0].table("nodes").equals(nodes)
    assert now.upgrade()["session_blocks_upgraded"] == 0


def test_rows_added_in_order_give_what_add_at_gives_to_the_bit():
    """Pooling adds each node's provenance rows with one vectorized step per rank: the sums are
    np.add.at's to the bit (negative zeros and long provenance lists included)."""
    import numpy as np

    from memlib.compose.vectors import add_in_order

    rng = np.random.default_rng(1)
    for _ in range(40):
        n = int(rng.integers(1, 40))
        node = np.repeat(np.arange(n), rng.integers(0, 7, n))
        if node.size:
            node[-1] = n - 1
            node = np.sort(np.r_[node, np.full(30, n - 1)])  # one node with a long list
        src = rng.integers(0, 20, node.size)
        rows = rng.normal(size=(20, 5)).astype(np.float32)
        rows[0] = -0.0
        want, got = np.zeros((n, 5), np.float32), np.zeros((n, 5), np.float32)
        np.add.at(want, node, rows[src])
        add_in_order(got, node, src, rows)
        assert np.array_equal(want.view(np.uint32), got.view(np.uint32))
