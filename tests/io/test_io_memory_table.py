"""A tenant's memory view row (memlib/io/memory_view.py ``memory_table``) made from Arrow columns, as
the build makes it (memlib/graph/memory_arrays.py ``memory_table_from_nodes``), is the row made from
Python lists, and both are the row the plain definition gives: the memory rows, their unit vectors,
each (memory, turn) citation in turn-then-memory order, the ids' checksums (decision 0066)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from memlib.io.memory_view import MEMORY_KINDS, embedding_matrix, ids_crc, memory_table

DIM = 4


def _nodes() -> pa.Table:
    """Nodes of every case: kinds in and out of the memory, provenance naming turns, other nodes,
    unknown ids, a turn twice, a null id; an empty and a null provenance; a null vector; two chunks."""
    ids = [f"n{i}" for i in range(10)]
    kinds = ["turn", "fact", "event", "entity", "fact", "turn", "fact", "event", "concept", "fact"]
    prov = [None, ["n5", "n0"], ["n0", "zz", "n5", "n5"], ["n0"], [], ["n5"], None, ["n1", None, "n0"],
            ["n5"], ["n0", "n5"]]
    rng = np.random.default_rng(7)
    vecs = [rng.normal(size=DIM).astype(np.float32).tolist() for _ in ids]
    vecs[6] = None
    typ = pa.list_(pa.float32(), DIM)
    table = pa.table({"node_id": ids, "kind": kinds, "provenance": pa.array(prov, pa.list_(pa.string())),
                      "embedding": pa.array(vecs, typ)})
    return pa.concat_tables([table.slice(0, 4), table.slice(4)])  # two chunks per column


def _reference(nodes: pa.Table, turn_ids: list[str]) -> dict:
    """The memory view's arrays by their plain definition (Python loops over the lists)."""
    ids, kinds = nodes.column("node_id").to_pylist(), nodes.column("kind").to_pylist()
    prov, vecs = nodes.column("provenance").to_pylist(), nodes.column("embedding").to_pylist()
    rows = [i for i, k in enumerate(kinds) if k in MEMORY_KINDS]
    pos = {t: i for i, t in enumerate(turn_ids)}
    pairs = sorted((pos[t], j) for j, r in enumerate(rows) for t in (prov[r] or ()) if t in pos)
    mat = np.array([vecs[r] if vecs[r] is not None else [0.0] * DIM for r in rows], np.float32)
    mat = mat / np.maximum(np.linalg.norm(mat, axis=1, keepdims=True), 1e-12)
    return {"mem_row": rows, "cite_turn": [t for t, _ in pairs], "cite_mem": [j for _, j in pairs],
            "vector": mat.ravel(), "mem_ids_crc": ids_crc([ids[r] for r in rows]), "turn_ids_crc": ids_crc(turn_ids)}


def test_memory_table_from_arrow_columns_equals_lists_and_the_plain_definition():
    nodes, turn_ids = _nodes(), ["n5", "n0"]
    rows = np.array([i for i, k in enumerate(nodes.column("kind").to_pylist()) if k in MEMORY_KINDS])
    vectors = embedding_matrix(nodes.column("embedding"), DIM, rows)
    arrow, arrow_meta = memory_table(nodes.column("node_id"), nodes.column("kind"), nodes.column("provenance"),
                                     vectors, pa.chunked_array([pa.array(turn_ids)]), None)
    lists, lists_meta = memory_table(nodes.column("node_id").to_pylist(), nodes.column("kind").to_pylist(),
                                     nodes.column("provenance").to_pylist(), vectors, turn_ids, None)
    assert arrow.equals(lists) and arrow_meta == lists_meta
    ref = _reference(nodes, turn_ids)
    for name in ("mem_row", "cite_turn", "cite_mem"):
        assert arrow.column(name)[0].as_py() == ref[name], name
    got = np.asarray(arrow.column("vector")[0].as_py(), np.float32)
    assert got.tobytes() == ref["vector"].tobytes()  # the same float32 operations, to the bit
    assert arrow_meta["mem_ids_crc"] == ref["mem_ids_crc"] and arrow_meta["turn_ids_crc"] == ref["turn_ids_crc"]
    assert arrow_meta["mem"] == len(ref["mem_row"]) and arrow_meta["nodes"] == nodes.num_rows


def test_embedding_matrix_reads_rows_where_they_lie_as_a_take_would():
    """With ``rows``, the vectors of a column without nulls are read in place; with nulls, taken: both
    give the take's rows normalized (null rows zero), and the column is left as it was."""
    rng = np.random.default_rng(3)
    typ = pa.list_(pa.float32(), DIM)
    dense = pa.chunked_array([pa.array(rng.normal(size=(5, DIM)).astype(np.float32).tolist(), typ)])
    rows = np.array([4, 0, 2], np.int32)
    before = dense.combine_chunks().flatten().to_numpy().copy()
    got = embedding_matrix(dense, DIM, rows)
    want = embedding_matrix(dense.take(pa.array(rows, pa.int64())), DIM)
    assert got.tobytes() == want.tobytes() and got.shape == (3, DIM)
    assert np.array_equal(dense.combine_chunks().flatten().to_numpy(), before)
    sliced = dense.combine_chunks().slice(1, 4)  # an offset into the values
    assert embedding_matrix(sliced, DIM, np.array([0, 3])).tobytes() == \
        embedding_matrix(sliced.take(pa.array([0, 3])), DIM).tobytes()
    holes = pa.array([[1.0, 0, 0, 0], None, [0, 3.0, 4.0, 0]], typ)
    np.testing.assert_array_equal(embedding_matrix(holes, DIM, np.array([2, 1])),
                                  np.array([[0, 0.6, 0.8, 0], [0, 0, 0, 0]], np.float32))
