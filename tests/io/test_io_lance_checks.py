"""The checksums of Lance rows (``lance_digest``: by content, whatever their order, chunking or string
type) and of published files (``[size, crc32, mtime_ns]``: a nightly hashes again only a carried
file written since its checksum was computed); docs/decisions/0031-kept-file-checksums.md."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from memlib import schema
from memlib.io import checksums
from memlib.io.lance_checks import rows_digest, tenant_digest


def nodes(n: int = 6, dim: int = 8) -> pa.Table:
    rng = np.random.default_rng(3)
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    rows = {"node_id": [f"n{i}" for i in range(n)], "tenant_id": ["t"] * n, "conversation_id": ["c"] * n,
            "kind": ["turn" if i % 2 else "fact" for i in range(n)], "text": [f"text {i} é" for i in range(n)],
            "time": [None] * n, "valid_from": [None] * n, "valid_to": [None] * n, "session_id": ["s"] * n,
            "belief": [0.5 if i % 3 else None for i in range(n)], "importance": [0.1 * i for i in range(n)],
            "source": ["heuristic"] * n, "prompt_version": [None] * n,
            "provenance": [[f"n{i}", "x"] if i % 2 == 0 else [] for i in range(n)], "attributes": ["{}"] * n,
            "embedding": list(vecs)}
    return schema.conform(pa.table(rows), schema.nodes_schema(dim), name="nodes")


def test_a_rows_digest_follows_content_not_order_chunks_or_string_types():
    t = nodes()
    d = rows_digest(t, "nodes")
    shuffled = t.take(pa.array([3, 0, 5, 1, 4, 2]))
    chunked = pa.concat_tables([shuffled.slice(0, 2), shuffled.slice(2)])
    large = chunked.cast(pa.schema([pa.field(f.name, pa.large_string()) if f.type == pa.string() else f
                                    for f in chunked.schema]))
    assert rows_digest(chunked, "nodes") == d == rows_digest(large, "nodes")
    # importance is kept apart (node_importance): not part of a Lance row's checksum
    cleared = t.set_column(t.column_names.index("importance"), t.schema.field("importance"),
                           pa.nulls(t.num_rows, pa.float32()))
    assert rows_digest(cleared, "nodes") == d
    assert tenant_digest(t)["turn_text"] == rows_digest(t.filter(pa.array([i % 2 == 1 for i in range(6)])),
                                                        "turn_text")


def test_any_changed_value_changes_the_digest():
    t = nodes()
    d = rows_digest(t, "nodes")
    vec = t.column("embedding").to_pylist()
    vec[2] = list(np.asarray(vec[2], np.float32) * np.float32(1.0000001) + np.float32(1e-7))
    changes = {
        "embedding": pa.array(vec, t.schema.field("embedding").type),
        "text": pa.array([*t.column("text").to_pylist()[:5], "text 5 e"]),
        "belief": pa.array([0.5, None, 0.5, None, 0.5, 0.5], pa.float32()),  # a null became a value
        "provenance": pa.array([["n0", "x"], [], ["n2x"], [], ["n4", "x"], []], pa.list_(pa.string())),
        "kind": pa.array(["fact", "turn", "fact", "turn", "fact", "fact"]),
    }
    for name, col in changes.items():
        changed = t.set_column(t.column_names.index(name), t.schema.field(name), col)
        assert rows_digest(changed, "nodes") != d, name
    assert rows_digest(t.slice(1), "nodes") != d  # a row gone


def test_a_published_files_checksum_names_its_mtime_and_a_write_since_is_hashed(tmp_path):
    v1 = tmp_path / "v1"
    (v1 / "turns").mkdir(parents=True)
    f = v1 / "turns" / "part.parquet"
    f.write_bytes(b"x" * 1000)
    crcs = checksums.tree_crcs(v1)
    entry = crcs["turns/part.parquet"]
    assert entry[:2] == checksums.crc_of(f) and entry[2] == os.stat(f).st_mtime_ns
    assert checksums.unchanged_since_checked(f, entry)
    data = bytearray(f.read_bytes())
    data[500:508] = b"\xff" * 8  # flipped in place, the size unchanged: the mtime moves
    f.write_bytes(bytes(data))
    os.utime(f, ns=(entry[2], entry[2] + 1_000_000))  # a write later than this one (a coarse clock may not tick)
    assert not checksums.unchanged_since_checked(f, entry)
    checksums.forget()
    try:
        checksums.check(f, entry)
        raise AssertionError("a flipped file passed its check")
    except checksums.DamagedFileError as exc:
        assert "content checksum" in str(exc)
    assert not checksums.unchanged_since_checked(f, entry[:2])  # an entry without an mtime: hashed


def test_a_carried_file_touched_but_whole_gets_its_new_mtime_once_checked(tmp_path):
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    for v in (v1, v2):
        (v / "turns").mkdir(parents=True)
    f = v1 / "turns" / "part.parquet"
    f.write_bytes(b"y" * 100)
    known = checksums.tree_crcs(v1)
    os.link(f, v2 / "turns" / "part.parquet")
    st = os.stat(f)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000))  # touched: the bytes are the same
    checksums.forget()
    assert checksums.tree_crcs(v2, v1, known)["turns/part.parquet"] == known["turns/part.parquet"]  # not checked
    checksums.check(f, known["turns/part.parquet"])  # the nightly's check of what was written since
    again = checksums.tree_crcs(v2, v1, known)["turns/part.parquet"]
    assert again[:2] == known["turns/part.parquet"][:2] and again[2] == os.stat(f).st_mtime_ns


def test_an_old_two_element_entry_is_read_as_before(tmp_path):
    f = Path(tmp_path) / "f"
    f.write_bytes(b"z" * 10)
    checksums.check(f, checksums.crc_of(f))
    checksums.check_size(f, checksums.crc_of(f))


def test_the_turn_text_digest_copies_no_vectors():
    n, dim = 8192, 384
    t = nodes(n, dim)
    turn_vectors = (n // 2) * dim * 4
    pool = pa.proxy_memory_pool(pa.default_memory_pool())
    before = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        digest = tenant_digest(t)
    finally:
        pa.set_memory_pool(before)
    turns = t.filter(pa.array([i % 2 == 1 for i in range(n)]))
    assert digest == {"nodes": rows_digest(t, "nodes"), "turn_text": rows_digest(turns, "turn_text")}
    # the filter of every column copied the turns' vectors to hash none of them
    assert pool.max_memory() < turn_vectors / 4, (pool.max_memory(), turn_vectors)
