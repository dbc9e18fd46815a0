"""Node vectors pooled in finalize's order (docs/decisions/0050-vectors-in-final-order.md): the embed
step orders the nodes (clues first, then each node id's first row sorted by kind and id, then the
repeated rows), link puts the merged clues, sorted, at the end of the clues' place, and finalize's
sorted unique nodes are then the leading rows of the embed step's buffer: the same table as
before, with no copy of the vectors."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.compose import steps
from memlib.compose.finalize import finalize, in_final_order, sorted_unique_nodes
from memlib.compose.state import BuildState
from memlib.compose.vectors import with_embeddings
from memlib.config import MemlibConfig
from tests.io.test_io_lance_checks import nodes

DIM = 8


def _raw(rng: np.random.Generator, kinds: tuple[str, ...]) -> tuple[pa.Table, np.ndarray]:
    """Nodes of several kinds in a shuffled order, clues among them, node ids repeated (a later row
    of an id has another text: finalize keeps the first), and a vector per row."""
    t = nodes(40, DIM)
    kind = rng.choice(list(kinds), t.num_rows).tolist()
    t = schema.conform(t.set_column(t.schema.get_field_index("kind"), "kind", pa.array(kind)), t.schema, name="nodes")
    again = t.take(pa.array([5, 9, 20, 31]))
    again = schema.conform(again.set_column(again.schema.get_field_index("text"), "text", pa.array(["later"] * 4)),
                           t.schema, name="nodes")
    t = pa.concat_tables([t, again]).drop_columns(["embedding"])
    t = t.take(pa.array(rng.permutation(t.num_rows)))
    return t, rng.standard_normal((t.num_rows, DIM)).astype(np.float32)


def _buffer(table: pa.Table) -> tuple[int, int]:
    chunks = table.column("embedding").chunks
    assert len(chunks) == 1
    vals = chunks[0].values
    return vals.buffers()[1].address + vals.offset * 4, len(vals) * 4


def _inside(table: pa.Table, vectors: np.ndarray) -> bool:
    addr, size = _buffer(table)
    return vectors.ctypes.data <= addr and addr + size <= vectors.ctypes.data + vectors.nbytes


def test_nodes_in_final_order_finalize_to_the_same_table_without_copying_the_vectors():
    """Without clues (link sorts the merged ones: the next test)."""
    rng = np.random.default_rng(11)
    raw, vectors = _raw(rng, ("turn", "fact", "entity", "session"))
    order = in_final_order(raw)
    # the vector of a row follows it (as the embed step pools each row from its own columns)
    moved = np.ascontiguousarray(vectors[_positions(raw, order)])
    want = sorted_unique_nodes(with_embeddings(raw, vectors, DIM))
    got = sorted_unique_nodes(with_embeddings(order, moved, DIM))
    assert got.equals(want)
    assert _inside(got, moved)  # the embed step's buffer itself: no sorted copy


def _positions(raw: pa.Table, table: pa.Table) -> list[int]:
    """Per row of ``table``: its row in ``raw`` (a row is its (node_id, text))."""
    pos = {k: i for i, k in enumerate(zip(raw.column("node_id").to_pylist(), raw.column("text").to_pylist()))}
    return [pos[k] for k in zip(table.column("node_id").to_pylist(), table.column("text").to_pylist())]


def _linked(vectors: np.ndarray, table: pa.Table, in_place: bool) -> tuple[pa.Table, pa.Table]:
    turns = pa.table({"node_id": pa.array([], pa.string()), "tenant_id": pa.array([], pa.string())})
    state = BuildState(turns=turns, cfg=MemlibConfig(), dim=DIM)
    state.embedded_nodes = with_embeddings(table, vectors, DIM)
    state.node_vectors = vectors if in_place else None
    steps.link(state)
    done = finalize(state.embedded_nodes, state.all_edges(), DIM)
    return done.nodes, done.edges


def test_merged_clues_take_the_end_of_the_clues_place_and_finalize_copies_no_vector():
    rng = np.random.default_rng(4)
    raw, vectors = _raw(rng, ("turn", "fact", "entity", "clue", "session"))
    is_clue = pc.equal(raw.column("kind"), "clue").to_numpy(zero_copy_only=False)
    clue_rows = np.flatnonzero(is_clue)
    vectors[clue_rows[:4]] = vectors[clue_rows[0]] + 1e-4 * rng.standard_normal((4, DIM))  # near-duplicates: merged
    table = in_final_order(raw)
    rows = _positions(raw, table)
    old_nodes, old_edges = _linked(vectors[rows], table, in_place=False)
    buf = np.ascontiguousarray(vectors[rows])
    new_nodes, new_edges = _linked(buf, table, in_place=True)
    kinds = old_nodes.column("kind").to_pylist()
    assert kinds.count("clue") < int(is_clue.sum())  # some clues merged
    assert new_nodes.equals(old_nodes) and new_edges.equals(old_edges)
    assert _inside(new_nodes, buf)
