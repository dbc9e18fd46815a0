"""A tenant's previous build, reused by a run that only added or removed turns.

A nightly run recomputes only new or changed sessions, but the tenant-level steps read the
whole tenant. Two of them cost what exists unless they start from the published version:

- node vectors (:func:`memlib.compose.steps.embed_nodes`): a derived node's vector is a function
  of its text, its provenance turns' token vectors and, for a token none of those turns has (a
  fallback id), that token's mean over every turn of the tenant. A node with the same id, kind,
  text and provenance as before, none of whose fallback ids changed its tenant mean (no added or
  removed turn holds it), has the same vector to the bit, so it is copied from the published
  nodes (:func:`pooled_reusing`). One whose fallback id's mean changed gets its new vector from
  its published local sum (``node_fallbacks.local``) and the new means, which come from the
  published exact per-id sums (``token_sums``) plus the added turns' rows (after a removal, from
  every token row summed again): no token row of an old turn is pooled for it. A clue's
  published vector is the one the link step merged, so a clue is never copied; one with the
  same id, text and provenance as published (``node_fallbacks.inputs``) gets its pooled vector
  the same way, from its kept local sum and the means;
- SIMILAR edges between turns (:func:`memlib.text.clues.similar_edges_changed`): only the pairs
  with an added turn, and those of the turns a removed turn was a neighbour of, are scored.

The facts and triplets steps copy the published rows whose inputs did not change
(:mod:`memlib.compose.extract_reuse`, from :attr:`PreviousTenant.extracted`).

"Only added and removed turns" (:func:`turn_changes`): every published turn still in the input has
the same text and vector (a new session, a deleted session or a forgotten conversation). Anything
else (an edited turn, another build key) and the steps run over the whole tenant as in a full
build. Either way the store equals a full build of the new input (tests/pipeline/test_pipeline_reuse.py,
``memlib bench nightly``).
"""
from __future__ import annotations

import hashlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.compose.published_parts import PublishedParts, read_parts, reusable
from memlib.compose.rows import (
    any_per_segment,
    copy_vectors_into,
    equal_missing,
    float32_blobs,
    int32_lists,
    pooled_into,
    provenance_of,
    same_lists,
    turn_rows,
)
from memlib.compose.span_pool import Fallback, IdSums, SpanPooler, fill_sums, is_clue, normalize_into
from memlib.compose.vectors import TurnVectors, pooled_vectors
from memlib.io.lance_delta import keyed_rows
from memlib.io.take import BLOCK_ROWS, VectorRows, take_column

NODE_COLUMNS = ["node_id", "kind", "text", "provenance", "embedding"]


@dataclass
class PreviousTenant:
    """What a tenant's published version holds that a run over it can reuse."""
    nodes: pa.Table    # NODE_COLUMNS of every node
    similar: pa.Table  # SIMILAR edges between two turns: src, dst, weight
    fallbacks: dict[str, Fallback] | None = None  # node id -> its Fallback (schema.NODE_FALLBACKS)
    sums: IdSums | None = None  # the tenant's per-id sums (schema.TOKEN_SUMS)
    clue_inputs: dict[str, str] = field(default_factory=dict)  # clue id (before the merge) -> clue_key
    rows: pa.Table | None = None  # its published Lance rows, every column but importance
    rows_keyed: Any = None  # memlib.io.lance_delta.keyed_rows of them, made as they are read
    # kind -> its turn, fact, concept, triplet and entity rows without embedding and importance, when
    # the nodes it was made of have every column (the extraction steps copy them: memlib.extract.prior)
    extracted: dict[str, pa.Table] | None = None

    @classmethod
    def of(cls, nodes: pa.Table, parts: PublishedParts) -> PreviousTenant:
        """The tenant whose published Lance rows are ``nodes`` and part files ``parts``."""
        extracted = _extracted(nodes)
        nodes = nodes.select(NODE_COLUMNS)
        turns = nodes.filter(pc.equal(nodes.column("kind"), schema.NodeKind.TURN.value)).column("node_id")
        similar = parts.similar
        similar = similar.filter(pc.and_(pc.is_in(similar.column("src"), turns),
                                         pc.is_in(similar.column("dst"), turns)))
        return cls(nodes, similar, parts.fallbacks, parts.sums, parts.clue_inputs, extracted=extracted)

    def fallbacks_of(self, node_ids: list[str]) -> list[Fallback | None]:
        """Per node id: its published :class:`Fallback`, or None when the published build did not list it."""
        known = self.fallbacks or {}
        return [known.get(n) for n in node_ids]


_EXTRACTED = [schema.NodeKind.TURN, schema.NodeKind.FACT, schema.NodeKind.CONCEPT, schema.NodeKind.TRIPLET,
              schema.NodeKind.ENTITY]


def _extracted(nodes: pa.Table) -> dict[str, pa.Table] | None:
    """:attr:`PreviousTenant.extracted` of published ``nodes``; None when they lack a column."""
    cols = [f.name for f in schema.NODES_NO_EMBEDDING if f.name != "importance"]
    if any(c not in nodes.column_names for c in cols):
        return None
    rows = nodes.select(cols)
    return {k.value: rows.filter(pc.equal(rows.column("kind"), k.value)) for k in _EXTRACTED}


def load_previous(store: str | Path, tenant: str, session_key: str, manifest: dict | None = None,
                  reader: Any = None, parts: Future | None = None) -> PreviousTenant | None:
    """The published version of ``tenant`` in ``store``, when it was built under ``session_key``
    (the same code format, config and encoder as this run); None otherwise. ``manifest``: the
    store's published manifest, when the caller has read it (a build's tenant actor reads it once,
    not once per tenant: it names every tenant); ``reader``: a
    :class:`~memlib.io.store.StoreReader` of that manifest, kept by the caller (its Lance table
    is opened once, not once per tenant); ``parts``: the future of :func:`read_parts` of the
    tenant in that reader, when the caller read them already."""
    from memlib.io.store import StoreReader, read_manifest

    manifest = reader.manifest if reader is not None else manifest if manifest is not None else read_manifest(store)
    if not reusable(manifest, tenant, session_key):
        return None
    reader = reader if reader is not None else StoreReader(store, manifest)
    # its part files are read on another thread while the Lance scan runs (lancedb's threads; the
    # calling one waits without the GIL), and its rows hashed on another while this one makes the
    # PreviousTenant of them: a damaged row is never reused (DamagedFileError, the tenant is built
    # whole): what was made of them is dropped before the caller sees it
    with ThreadPoolExecutor(2, thread_name_prefix="memlib-previous") as pool:
        parts = parts if parts is not None else pool.submit(read_parts, reader, tenant)
        # every column of its Lance rows but importance: the run's Lance write compares them
        # (memlib.io.lance_delta), and the reuse steps read NODE_COLUMNS of them
        rows = reader.unchecked_rows(tenant)
        checked = pool.submit(reader.check_rows, tenant, "nodes", rows)
        try:
            previous = _previous_of(rows.select([f.name for f in schema.NODES if f.name != "importance"]),
                                    parts.result())
        except Exception:
            checked.result()  # a damaged row's error first
            raise
        checked.result()
    return previous


def _previous_of(rows: pa.Table, parts: PublishedParts) -> PreviousTenant | None:
    if rows.num_rows == 0:
        return None
    previous = PreviousTenant.of(rows, parts)
    previous.rows = rows
    previous.rows_keyed = keyed_rows(rows)  # the run's Lance delta joins on it after the tenant steps
    return previous


def clue_key(text: str | None, provenance: list[str] | None) -> str:
    """What a clue's pooled vector depends on besides the tenant's token rows: its text and its
    provenance turns, hashed (``node_fallbacks.inputs``)."""
    blob = (text or "") + "\x1e" + "\x1f".join(provenance or [])
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]


def _clue_keys(nodes: pa.Table, rows: np.ndarray) -> list[str]:
    take = pa.array(np.asarray(rows, dtype=np.int64))
    return [clue_key(t, p) for t, p in zip(nodes.column("text").take(take).to_pylist(),
                                          nodes.column("provenance").take(take).to_pylist())]


def _same_pooled(provenance: pa.Table, tv: TurnVectors, col: pa.ChunkedArray, rows: np.ndarray) -> bool:
    """Whether the vectors pooled from ``provenance`` (:func:`memlib.compose.vectors.pooled_vectors`)
    are ``col``'s rows ``rows`` to the bit. A row's pooled vector depends on its provenance alone, so
    they are pooled and compared a block at a time in one reused buffer (no tenant-wide temporary),
    read where they lie when ``col`` is float32 without nulls."""
    view = VectorRows.of(col)
    dim = tv.vectors.shape[1]
    if view is None or view.valid.size != len(col) or not view.valid.all() or view.dim != dim:
        emb = col.combine_chunks()  # compared whole, as float32 bits
        old = np.ascontiguousarray(emb.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False))
        vectors = pooled_vectors(provenance, tv.node_ids, tv.vectors)
        return np.array_equal(vectors.view(np.uint32), old.view(np.uint32).reshape(len(emb), -1)[rows])
    buf = np.empty((min(BLOCK_ROWS, rows.size), dim), np.float32)
    for s in range(0, rows.size, BLOCK_ROWS):
        part = buf[:min(BLOCK_ROWS, rows.size - s)]
        pooled_vectors(provenance.slice(s, BLOCK_ROWS), tv.node_ids, tv.vectors, out=part)
        if not np.array_equal(part.view(np.uint32), view.rows(rows[s:s + BLOCK_ROWS])):
            return False
    return True


@dataclass(frozen=True)
class TurnChanges:
    """What a run changed in a tenant's turns since its published build, when it only added and
    removed turns (every published turn still there has the same text and vector)."""
    added: list[str]     # ids of the turns the published build does not have
    removed: list[str]   # ids of its turns that are gone


def turn_changes(nodes: pa.Table, tv: TurnVectors, previous: PreviousTenant) -> TurnChanges | None:
    """The turns ``nodes`` has and ``previous`` has not, and those ``previous`` has and ``nodes``
    has not, when every turn in both has the same text and vector; else None. In columns: the
    published turns are matched to this run's by id, their texts compared as arrays and their
    vectors as float32 bits (no Python object per turn)."""
    now, before = nodes, previous.nodes
    rows_now, rows_before = turn_rows(now), turn_rows(before)  # read where they lie: no copied table
    ids, old_ids = take_column(now.column("node_id"), rows_now), take_column(before.column("node_id"), rows_before)
    at = pc.index_in(old_ids, value_set=ids)  # per published turn: its row among this run's turns
    both = at.is_valid()
    old_rows = rows_before[np.flatnonzero(both.to_numpy(zero_copy_only=False))]
    new_rows = rows_now[pc.filter(at, both).to_numpy(zero_copy_only=False).astype(np.int64)]
    texts_now, texts_before = take_column(now.column("text"), new_rows), take_column(before.column("text"), old_rows)
    same_text = pc.equal(pc.fill_null(texts_now, "\x00"), pc.fill_null(texts_before, "\x00"))
    if new_rows.size and not pc.all(same_text).as_py():
        return None
    if new_rows.size and not _same_pooled(provenance_of(nodes, new_rows), tv, before.column("embedding"), old_rows):
        return None
    added = pc.filter(ids, pc.invert(pc.is_in(ids, value_set=old_ids))).to_pylist()
    return TurnChanges(list(dict.fromkeys(added)), pc.filter(old_ids, pc.invert(both)).to_pylist())


def appended_turns(nodes: pa.Table, tv: TurnVectors, previous: PreviousTenant) -> list[str] | None:
    """The turns ``nodes`` added to ``previous``, when that is all that changed (:func:`turn_changes`)."""
    changes = turn_changes(nodes, tv, previous)
    return changes.added if changes is not None and not changes.removed else None


def _unchanged(nodes: pa.Table, rows: np.ndarray, previous: PreviousTenant) -> tuple[np.ndarray, np.ndarray]:
    """Of the node rows ``rows``: those whose id, kind, text and provenance are as in
    ``previous``, and each one's row in ``previous.nodes`` (the first with its id: finalize keeps one
    row per id). In columns: each row's published row is found by id and the other three columns
    are compared there (two nulls equal)."""
    old = previous.nodes
    at = pc.index_in(take_column(nodes.column("node_id"), rows), value_set=old.column("node_id"))
    valid = at.is_valid()
    here = rows[np.flatnonzero(valid.to_numpy(zero_copy_only=False))]
    there = pc.filter(at, valid).to_numpy(zero_copy_only=False).astype(np.int64)
    same = np.ones(here.size, dtype=bool)
    for col in ("kind", "text", "provenance"):
        new_col, old_col = take_column(nodes.column(col), here), take_column(old.column(col), there)
        same &= same_lists(new_col, old_col) if col == "provenance" else equal_missing(new_col, old_col)
    return here[same], there[same]


@dataclass
class Reused:
    """What :func:`pooled_reusing` returns."""
    vectors: np.ndarray                 # every node's vector
    copied: int                         # node vectors copied from the published build
    refilled: int                       # moved nodes and unchanged clues given their vector from their kept sums
    fallbacks: dict[int, Fallback]      # per derived node row (clues before their merge included)
    sums: IdSums                        # the tenant's per-id sums, added turns included
    copied_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # rows of ``copied``


def pooled_reusing(nodes: pa.Table, tv: TurnVectors, tokenizer: Any, previous: PreviousTenant,
                   changes: TurnChanges) -> Reused:
    """:func:`memlib.compose.span_pool.span_pooled_with_fallbacks` of ``nodes`` after a run that
    only added and removed turns (:func:`turn_changes`), reading no token row of an old turn for a
    node whose inputs did not change:

    - its vector is copied from ``previous`` when none of its fallback ids changed its tenant mean;
    - else (it *moved*: an added or removed turn changed the tenant mean of one of its fallback
      ids) its vector is its published ``local`` sum plus the new means. After an append the new
      sums are the published per-id sums plus the added turns' rows; after a removal every token
      row is summed again, and the ids whose sums differ from the published ones are those that
      moved (the sums are exact: :class:`memlib.compose.span_pool.IdSums`);
    - a clue (never copied: its published vector is the merged one) whose id, text and
      provenance are as published gets its vector the same way, from its kept local sum;
    - nodes that are new or changed, and moved nodes without a published ``local``, are pooled
      as in a full build.

    The vectors equal a full build's to the bit (tests/pipeline/test_pipeline_reuse.py)."""
    assert tv.token_ids is not None and tv.token_vectors is not None
    n = nodes.num_rows
    out = np.zeros((n, tv.vectors.shape[1] if tv.vectors.ndim == 2 else 0), dtype=np.float32)
    turns = turn_rows(nodes)
    pooled_into(out, turns, provenance_of(nodes, turns), tv)
    derived = np.setdiff1d(np.arange(n), turns)
    # a clue's published vector is its merged one (renormalized in the link step), not its pooled one
    clue = is_clue(nodes, derived)
    poolable = derived[~clue]
    rows, prev_rows = _unchanged(nodes, poolable, previous)
    position = {t: i for i, t in enumerate(tv.node_ids)}
    new = [position[t] for t in changes.added if t in position]
    fresh = np.unique(np.concatenate([tv.token_ids[i] for i in new])) if new else np.zeros(0, np.int64)
    if previous.sums is not None and not changes.removed:  # moved here and added to in place (no 64 MB copy):
        kept, previous.sums = previous.sums, None  # a later use of ``previous`` sums every row again
        sums = kept.plus(IdSums.of([tv.token_ids[i] for i in new], [tv.token_vectors[i] for i in new]), in_place=True)
    else:  # a removal, or a published build without its sums: every row is read once
        sums = IdSums.of(tv.token_ids, tv.token_vectors)
        if changes.removed:
            fresh = np.union1d(fresh, sums.changed_since(previous.sums))
    moved, kept = _moved(nodes, rows, prev_rows, previous, _Pooling(tv, tokenizer, sums), fresh)
    # a node with fallback ids but no kept local sum (not listed when published) is pooled again
    whole = np.array([f.ids.size == 0 or f.local is not None for f in kept], dtype=bool)
    copy = ~moved & whole
    copy_rows, copy_prev = rows[copy], prev_rows[copy]
    copy_vectors_into(out, copy_rows, previous.nodes.column("embedding"), copy_prev)
    fallbacks = {r: f for r, f, c in zip(rows.tolist(), kept, copy.tolist()) if c}
    refill = np.flatnonzero(moved & whole)
    clue_rows, clue_fb = _kept_clues(nodes, derived[clue], previous)
    refill_rows = np.concatenate([rows[refill], clue_rows])
    refill_fb = [kept[k] for k in refill.tolist()] + clue_fb
    _refill(out, nodes, tv, refill_rows, refill_fb, sums)
    fallbacks.update(zip(refill_rows.tolist(), refill_fb))
    redo = np.setdiff1d(derived, np.concatenate([copy_rows, refill_rows]))
    pooler = SpanPooler.of(nodes, provenance_turns(nodes, redo, tv), tokenizer, rows=redo, sums=sums)
    if pooler is not None:
        pooled_into(out, redo, provenance_of(nodes, redo), tv)
        fallbacks.update(zip(redo.tolist(), pooler.pool_into(out, np.arange(redo.size), is_clue(nodes, redo))))
    return Reused(out, int(copy_rows.size), int(refill_rows.size), fallbacks, sums, copy_rows.astype(np.int64))


def provenance_turns(nodes: pa.Table, rows: np.ndarray, tv: TurnVectors) -> TurnVectors:
    """The turns of ``tv`` that a node at ``rows`` cites (all of ``tv`` when none does): what pooling
    those nodes reads besides the tenant's per-id sums. The same bits as pooling them over every
    turn: each node sums the rows of its own turns, in the same order (turns by node id)."""
    if rows.size == 0:
        return tv
    cited = pc.list_flatten(nodes.column("provenance").take(pa.array(rows, pa.int64())))
    mask = pc.is_in(pa.array(tv.node_ids, pa.string()), value_set=pc.unique(cited)).to_numpy(zero_copy_only=False)
    return tv.subset(np.flatnonzero(mask)) if mask.any() else tv


def _kept_clues(nodes: pa.Table, clue_rows: np.ndarray, previous: PreviousTenant) -> tuple[np.ndarray, list[Fallback]]:
    """The clue rows whose published entry (same id, same :func:`clue_key`) kept a local sum, and
    those entries: their pooled vector follows from it and the tenant means."""
    if clue_rows.size == 0 or not previous.clue_inputs:
        return np.zeros(0, np.int64), []
    ids = nodes.column("node_id").take(pa.array(clue_rows, pa.int64())).to_pylist()
    known = previous.fallbacks_of(ids)
    keep = [k for k, (n, key, f) in enumerate(zip(ids, _clue_keys(nodes, clue_rows), known))
            if f is not None and f.local is not None and previous.clue_inputs.get(n) == key]
    return clue_rows[keep], [known[k] for k in keep]  # type: ignore[misc]


def _refill(out: np.ndarray, nodes: pa.Table, tv: TurnVectors, rows: np.ndarray, kept: list[Fallback],
            sums: IdSums) -> None:
    """Write into ``out[rows]`` each node's vector from its kept local sum plus its fallback ids'
    means (``sums``), normalized; the mean of its turns' vectors when that sum is zero, as in
    :meth:`memlib.compose.span_pool.SpanPooler.pool_into`. Reads no token row."""
    for s in range(0, rows.size, BLOCK_ROWS):  # a node's row is the same in any block: no tenant-wide temporaries
        _refill_block(out, nodes, tv, rows[s:s + BLOCK_ROWS], kept[s:s + BLOCK_ROWS], sums)


def _refill_block(out: np.ndarray, nodes: pa.Table, tv: TurnVectors, rows: np.ndarray, kept: list[Fallback],
                  sums: IdSums) -> None:
    lengths = np.fromiter((f.ids.size for f in kept), dtype=np.int64, count=len(kept))
    local = np.stack([f.local for f in kept]).astype(np.float32, copy=False)  # type: ignore[misc]
    fill = fill_sums(np.repeat(np.arange(len(kept), dtype=np.int64), lengths),
                     np.concatenate([f.ids for f in kept]).astype(np.int64),
                     np.concatenate([f.counts for f in kept]), sums, len(kept), local.shape[1])
    total = np.add(local, fill, out=local)  # ``local`` is the block's own stacked copy
    zero = np.linalg.norm(total, axis=1) <= 1e-12  # normalize_into leaves these rows: they get their turns' mean
    if zero.any():
        out[rows[zero]] = pooled_vectors(provenance_of(nodes, rows[zero]), tv.node_ids, tv.vectors)
    normalize_into(out, rows, total)


@dataclass(frozen=True)
class _Pooling:
    """What pooling a node's vector reads: the tenant's turn token rows, the tokenizer of node texts
    and the tenant's per-id sums."""
    tv: TurnVectors
    tokenizer: Any
    sums: IdSums


def _moved(nodes: pa.Table, rows: np.ndarray, prev_rows: np.ndarray, previous: PreviousTenant, pooling: _Pooling,
           fresh: np.ndarray) -> tuple[np.ndarray, list[Fallback]]:
    """Per unchanged node row (``rows``; ``prev_rows`` the same nodes' rows in ``previous.nodes``):
    whether one of its fallback ids is in ``fresh`` (the ids whose tenant-wide means changed), and
    its :class:`Fallback`. They are read from the published ``node_fallbacks`` when it lists the
    node, else found by tokenizing its text (then without ``local``)."""
    known = previous.fallbacks_of(previous.nodes.column("node_id").take(pa.array(prev_rows, pa.int64())).to_pylist())
    unknown = np.array([k for k, f in enumerate(known) if f is None], dtype=np.int64)
    if unknown.size:
        pooler = SpanPooler.of(nodes, pooling.tv, pooling.tokenizer, rows=rows[unknown], sums=pooling.sums)
        if pooler is not None:
            for k, f in zip(unknown.tolist(), pooler.fallbacks(np.arange(unknown.size))):
                known[k] = f
    none = np.zeros(0, np.int32)
    fallbacks = [Fallback(none, none) if f is None else f for f in known]
    lengths = np.fromiter((f.ids.size for f in fallbacks), dtype=np.int64, count=len(fallbacks))
    flat = np.concatenate([f.ids for f in fallbacks]) if fallbacks else none
    return any_per_segment(np.isin(flat, fresh), lengths), fallbacks


def fallbacks_table(nodes: pa.Table, fallbacks: dict[int, Fallback]) -> pa.Table:
    """``schema.NODE_FALLBACKS`` rows of the derived nodes of ``nodes`` (one per node id), clues
    with their :func:`clue_key`."""
    rows = np.fromiter(sorted(fallbacks), np.int64, len(fallbacks))
    node_ids = take_column(nodes.column("node_id"), rows)
    # one row per node id, its first: chosen before the columns are built (no filtered copy of them)
    first = pl.from_arrow(node_ids).is_first_distinct().to_numpy()
    rows, node_ids = rows[first], node_ids.filter(pa.array(first))
    fb = [fallbacks[r] for r in rows.tolist()]
    clue = is_clue(nodes, rows)
    keys = iter(_clue_keys(nodes, rows[clue]))
    inputs = [next(keys) if c else None for c in clue.tolist()]
    table = pa.table({"tenant_id": take_column(nodes.column("tenant_id"), rows), "node_id": node_ids,
                      "ids": int32_lists([f.ids for f in fb]), "counts": int32_lists([f.counts for f in fb]),
                      "local": float32_blobs([f.local for f in fb]), "inputs": pa.array(inputs, pa.string())})
    return schema.conform(table, schema.NODE_FALLBACKS, name="node_fallbacks")
