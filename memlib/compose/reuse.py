"""A tenant's previous build, reused by a run that only appended turns to it.

A nightly run recomputes only new or changed sessions, but the tenant-level steps read the
whole tenant. Two of them cost what exists unless they start from the published version:

- node vectors (:func:`memlib.compose.steps.embed_nodes`): a derived node's vector is a function
  of its text, its provenance turns' token vectors and, for a token none of those turns has, that
  token's mean over every turn of the tenant. When the run only added turns, a node with the same
  id, kind, text and provenance as before, none of whose such tokens occurs in an added turn, has
  the same vector to the bit, so it is copied from the published nodes
  (:func:`pooled_reusing`). Clues are pooled again: the published vector of a clue is the one
  the link step merged and renormalized;
- SIMILAR edges between turns (:func:`memlib.text.clues.similar_edges_appended`): only the pairs
  with an added turn are scored.

"Only added turns" (:func:`appended_turns`): every published turn is still there with the same
text and vector. Anything else (a changed or deleted session, another build key) and the
steps run over the whole tenant as in a full build. Either way the store equals a full build of
the new input (tests/pipeline/test_pipeline_reuse.py, ``memlib bench nightly``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.compose.vectors import SpanPooler, TurnVectors, pooled_vectors

NODE_COLUMNS = ["node_id", "kind", "text", "provenance", "embedding"]


@dataclass
class PreviousTenant:
    """What a tenant's published version holds that a run over it can reuse."""
    nodes: pa.Table    # NODE_COLUMNS of every node
    similar: pa.Table  # SIMILAR edges between two turns: src, dst, weight

    @classmethod
    def of(cls, nodes: pa.Table, edges: pa.Table) -> PreviousTenant:
        nodes = nodes.select(NODE_COLUMNS)
        turns = nodes.filter(pc.equal(nodes.column("kind"), schema.NodeKind.TURN.value)).column("node_id")
        similar = edges.filter(pc.and_(pc.equal(edges.column("kind"), schema.EdgeKind.SIMILAR.value),
                                       pc.and_(pc.is_in(edges.column("src"), turns),
                                               pc.is_in(edges.column("dst"), turns))))
        return cls(nodes, similar.select(["src", "dst", "weight"]))


def load_previous(store: str | Path, tenant: str, session_key: str) -> PreviousTenant | None:
    """The published version of ``tenant`` in ``store``, when it was built under ``session_key``
    (the same code format, config and encoder as this run); None otherwise."""
    from memlib.io.store import StoreReader, read_manifest

    manifest = read_manifest(store)
    if (manifest is None or manifest.get("session_build_key") != session_key
            or tenant not in manifest.get("tenants", {})):
        return None
    reader = StoreReader(store, manifest)
    nodes = reader.nodes(tenant, columns=NODE_COLUMNS)
    if nodes.num_rows == 0:
        return None
    return PreviousTenant.of(nodes, reader.edges(tenant))


def _embedding_bytes(table: pa.Table) -> list[bytes]:
    emb = table.column("embedding").combine_chunks()
    flat = emb.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(len(emb), -1)
    return [row.tobytes() for row in flat]


def appended_turns(nodes: pa.Table, tv: TurnVectors, previous: PreviousTenant) -> list[str] | None:
    """The ids of the turns ``nodes`` has and ``previous`` has not, when every previous turn is
    among ``nodes`` with the same text and vector (a run that only appended turns); else None."""
    is_turn = pc.equal(nodes.column("kind"), schema.NodeKind.TURN.value)
    turns = nodes.filter(is_turn)
    before = previous.nodes.filter(pc.equal(previous.nodes.column("kind"), schema.NodeKind.TURN.value))
    now = dict(zip(turns.column("node_id").to_pylist(), turns.column("text").to_pylist()))
    old_ids = before.column("node_id").to_pylist()
    if any(n not in now or now[n] != t for n, t in zip(old_ids, before.column("text").to_pylist())):
        return None
    old = set(old_ids)
    keep = [i for i, n in enumerate(turns.column("node_id").to_pylist()) if n in old]
    vectors = pooled_vectors(turns.take(pa.array(keep, pa.int64())), tv.node_ids, tv.vectors)
    mine = {turns.column("node_id")[i].as_py(): vectors[k].tobytes() for k, i in enumerate(keep)}
    if any(mine[n] != b for n, b in zip(old_ids, _embedding_bytes(before))):
        return None
    return [n for n in now if n not in old]


def _unchanged(nodes: pa.Table, rows: np.ndarray, previous: PreviousTenant) -> tuple[np.ndarray, np.ndarray]:
    """Of the node rows ``rows``: those whose id, kind, text and provenance are as in
    ``previous``, and each one's row in ``previous.nodes``."""
    cols = ["node_id", "kind", "text", "provenance"]
    keyed = lambda t: pl.from_arrow(t.select(cols)).with_columns(  # noqa: E731 - a list key as one string
        pl.col("provenance").list.join("\x1f").fill_null("\x00").alias("provenance"),
        pl.col("text").fill_null("\x00"))
    new = keyed(nodes.take(pa.array(rows, pa.int64()))).with_columns(pl.Series("_row", rows, dtype=pl.Int64))
    old = keyed(previous.nodes).with_row_index("_prev")
    same = new.join(old, on=cols, how="inner").sort("_row")
    return same["_row"].to_numpy().astype(np.int64), same["_prev"].to_numpy().astype(np.int64)


def pooled_reusing(nodes: pa.Table, tv: TurnVectors, tokenizer: Any, previous: PreviousTenant,
                   added: list[str]) -> tuple[np.ndarray, int]:
    """:func:`memlib.compose.vectors.span_pooled_vectors` of ``nodes`` after a run that only
    added the turns ``added`` (:func:`appended_turns`): the vectors of unchanged nodes copied
    from ``previous``, the others pooled. Returns (vectors, how many were copied)."""
    assert tv.token_ids is not None and tv.token_vectors is not None
    n = nodes.num_rows
    out = np.zeros((n, tv.vectors.shape[1] if tv.vectors.ndim == 2 else 0), dtype=np.float32)
    pooler = SpanPooler.of(nodes, tv, tokenizer)
    derived = pooler.derived if pooler is not None else np.zeros(0, np.int64)
    is_turn = np.ones(n, dtype=bool)
    is_turn[derived] = False
    turn_rows = np.flatnonzero(is_turn)
    out[turn_rows] = pooled_vectors(nodes.take(pa.array(turn_rows, pa.int64())), tv.node_ids, tv.vectors)
    if pooler is None:
        return out, 0
    # a clue's published vector is its merged one (renormalized in the link step), not its pooled one
    poolable = derived[np.asarray(nodes.column("kind").take(pa.array(derived, pa.int64())).to_pylist(), dtype=object)
                       != schema.NodeKind.CLUE.value]
    rows, prev_rows = _unchanged(nodes, poolable, previous)
    which = np.searchsorted(derived, rows)  # derived is ascending: each unchanged row's index in it
    position = {t: i for i, t in enumerate(tv.node_ids)}
    added_ids = [tv.token_ids[position[t]] for t in added if t in position]
    fresh_ids = np.unique(np.concatenate(added_ids)) if added_ids else np.zeros(0, np.int64)
    moved = pooler.falls_back_to(which, fresh_ids) if which.size else np.zeros(0, dtype=bool)
    copy_rows, copy_prev = rows[~moved], prev_rows[~moved]
    if copy_rows.size:
        emb = previous.nodes.column("embedding").take(pa.array(copy_prev, pa.int64())).combine_chunks()
        out[copy_rows] = emb.flatten().to_numpy(zero_copy_only=False).reshape(copy_rows.size, -1)
    redo = np.setdiff1d(np.arange(derived.size), which[~moved])
    if redo.size:
        out[derived[redo]] = pooled_vectors(nodes.take(pa.array(derived[redo], pa.int64())), tv.node_ids, tv.vectors)
        pooler.pool_into(out, redo)
    return out, int(copy_rows.size)
