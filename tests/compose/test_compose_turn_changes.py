"""What a run changed in a tenant's turns (memlib.compose.reuse.turn_changes), found in columns, equals
the per-turn comparison it replaced, on random tenants with added, removed, edited and re-encoded turns."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from memlib import schema
from memlib.compose.published_parts import PublishedParts
from memlib.compose.reuse import PreviousTenant, TurnChanges, turn_changes
from memlib.compose.vectors import TurnVectors, pooled_vectors

DIM = 4


def _nodes(ids: list[str], texts: list[str | None], vectors: np.ndarray, facts: int = 2) -> pa.Table:
    n = len(ids)
    kinds = ["turn"] * n + ["fact"] * facts
    vecs = np.concatenate([vectors, np.ones((facts, DIM), np.float32)]) if facts else vectors
    table = pa.table({"node_id": ids + [f"f{i}" for i in range(facts)], "kind": kinds,
                      "text": texts + ["a fact"] * facts,
                      "provenance": [[i] for i in ids] + [ids[:1]] * facts,
                      "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1), pa.float32()), DIM)})
    return pa.concat_tables([table.slice(0, n // 2), table.slice(n // 2)])  # chunked, as read back


def _reference(nodes: pa.Table, tv: TurnVectors, previous: PreviousTenant) -> TurnChanges | None:
    """The per-turn comparison (the code before the columns)."""
    turns = nodes.filter(pa.array([k == schema.NodeKind.TURN.value for k in nodes.column("kind").to_pylist()]))
    before = previous.nodes.filter(pa.array([k == "turn" for k in previous.nodes.column("kind").to_pylist()]))
    ids = turns.column("node_id").to_pylist()
    now = dict(zip(ids, turns.column("text").to_pylist()))
    old_ids = before.column("node_id").to_pylist()
    if any(n in now and now[n] != t for n, t in zip(old_ids, before.column("text").to_pylist())):
        return None
    old = set(old_ids)
    keep = [i for i, n in enumerate(ids) if n in old]
    vectors = pooled_vectors(turns.take(pa.array(keep, pa.int64())), tv.node_ids, tv.vectors)
    mine = {ids[i]: vectors[k].tobytes() for k, i in enumerate(keep)}
    emb = before.column("embedding").combine_chunks()
    flat = emb.flatten().to_numpy(zero_copy_only=False).reshape(len(emb), -1)
    if any(n in mine and mine[n] != b.tobytes() for n, b in zip(old_ids, flat)):
        return None
    return TurnChanges([n for n in now if n not in old], [n for n in old_ids if n not in now])


@pytest.mark.parametrize("block", [None, 2, 5])
@pytest.mark.parametrize("seed", range(12))
def test_turn_changes_equal_the_per_turn_comparison(seed, block, monkeypatch):
    """``block``: the turns' vectors pooled and compared that many rows at a time (a big tenant's
    blocks; a bit off in any block is found)."""
    if block is not None:
        monkeypatch.setattr("memlib.compose.reuse.BLOCK_ROWS", block)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 30))
    ids = [f"t{i}" for i in range(n)]
    texts: list[str | None] = [None if rng.random() < 0.1 else f"text {i}" for i in range(n)]
    raw = rng.standard_normal((n, DIM)).astype(np.float32)
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    now_rows = sorted(rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False).tolist())
    old_rows = sorted(rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False).tolist())
    tv = TurnVectors([ids[i] for i in now_rows], raw[now_rows])
    new_texts = [texts[i] for i in now_rows]
    old_texts = [texts[i] for i in old_rows]
    old_vecs = unit[old_rows].copy()
    case = seed % 4
    if case == 1:  # an edited text, or a null one that became empty
        k = int(rng.integers(len(old_rows)))
        old_texts[k] = "" if old_texts[k] is None else None
    elif case == 2:  # a published vector one bit off
        k = int(rng.integers(len(old_rows)))
        old_vecs[k, 0] = np.nextafter(old_vecs[k, 0], np.float32(2))
    nodes = _nodes([ids[i] for i in now_rows], new_texts, unit[now_rows])
    previous = PreviousTenant.of(_nodes([ids[i] for i in old_rows], old_texts, old_vecs, facts=1),
                                 PublishedParts.of(schema.empty(schema.EDGES)))
    assert turn_changes(nodes, tv, previous) == _reference(nodes, tv, previous)
