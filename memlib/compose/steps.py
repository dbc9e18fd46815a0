"""Tenant-level steps of the build, reading and writing a ``BuildState``.

The modules behind a step are imported inside it, so a recipe that leaves a step out never
loads its dependencies (spaCy, dateparser, ...).
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.compose.rows import filter_runs
from memlib.compose.span_pool import span_pooled_with_fallbacks
from memlib.compose.vectors import pooled_vectors, with_embeddings
from memlib.config import Backend
from memlib.extract.base import Extraction

if TYPE_CHECKING:
    from memlib.compose.state import BuildState
    from memlib.extract.base import ExtractionContext, ExtractResult


def clues(state: BuildState) -> None:
    """One clue per session from the sessions' clue drafts (their scored keyphrase candidates,
    session-local); the keyphrases are ranked by IDF over the tenant's sessions, so tenant-level."""
    state.add(*clue_tables(state))


def clue_tables(state: BuildState) -> tuple[pa.Table, pa.Table]:
    """The clue step's nodes and edges; it reads only the clue drafts, the segments and the config,
    which no extraction step changes (:func:`memlib.compose.reference.tenant_steps` runs it beside them)."""
    from memlib.text.clues import clues_from_drafts

    return clues_from_drafts(state.drafts["clue_drafts"], state.segments, state.cfg.clues)


def kept_turn_ids(state: BuildState) -> frozenset[str] | None:
    if state.segments is None or state.segments.num_rows == 0:
        return None
    if state.segments.column("kept_turn_ids").null_count == state.segments.num_rows:
        return None  # not gated: every turn is kept
    kept = pc.list_flatten(state.segments.column("kept_turn_ids"))
    return frozenset(kept.to_pylist())


def extract_one(ctx: ExtractionContext, extraction: Extraction,
                drafts: dict[str, pa.Table] | None = None) -> ExtractResult:
    """One extraction with its configured backend: a heuristic facts or triplets extraction
    finishes the session drafts when given them, every other case runs over ``ctx``."""
    from memlib.extract.base import backend_of, get_extractor

    backend = backend_of(ctx.config, extraction)
    extractor = get_extractor(extraction, backend)
    if drafts is not None and backend is Backend.HEURISTIC and extraction is Extraction.FACTS:
        result = extractor.finish(drafts["fact_drafts"], ctx)
    elif drafts is not None and backend is Backend.HEURISTIC and extraction is Extraction.TRIPLETS:
        result = extractor.finish(drafts["entity_mentions"], drafts["triplet_drafts"], ctx)
    else:
        result = extractor.run(ctx)
    return result.conformed(extraction.value)


def run_extractions(ctx: ExtractionContext) -> ExtractResult:
    """Every configured extraction over one context, without session drafts (tests, benchmarks);
    the facts' nodes are handed to the later extractions, as in the build."""
    from memlib.extract.base import ExtractResult, configured

    results = []
    for extraction in configured(ctx.config):
        result = extract_one(ctx, extraction)
        if extraction is Extraction.FACTS:
            ctx.facts = result.nodes
        results.append(result)
    return ExtractResult.concat(results)


def extract(state: BuildState, extraction: Extraction) -> None:
    """The build's extraction step: one extraction over the tenant, from its session drafts."""
    from memlib.extract.base import ExtractionContext, configured

    if extraction not in configured(state.cfg):
        return
    result = _extract_reusing(state, extraction)
    if result is None:
        ctx = ExtractionContext(turns=state.turns, kept_turn_ids=kept_turn_ids(state), config=state.cfg,
                                nlp=state.nlp, facts=state.facts, extras=state.extras)
        result = extract_one(ctx, extraction, state.drafts)
        state.nlp = ctx.nlp  # loaded once, reused by the next extraction
    state.add(result.nodes, result.edges)
    if extraction is Extraction.FACTS:
        state.facts = result.nodes


def _extract_reusing(state: BuildState, extraction: Extraction) -> ExtractResult | None:
    """The heuristic facts or triplets step after a run that only added or removed turns of a
    published tenant, copying its unchanged rows (:mod:`memlib.compose.extract_reuse`); None
    when the step runs as in a full build."""
    from memlib.extract.base import backend_of

    if (extraction not in (Extraction.FACTS, Extraction.TRIPLETS) or state.previous is None
            or backend_of(state.cfg, extraction) is not Backend.HEURISTIC or not state.drafts):
        return None
    from memlib.compose import extract_reuse

    prior = state.reusing(extract_reuse.prior_of, state)
    if prior is None:
        return None
    finish = extract_reuse.finish_facts if extraction is Extraction.FACTS else extract_reuse.finish_triplets
    result = state.reusing(finish, state, prior)
    return None if result is None else result.conformed(extraction.value)


def embed_nodes(state: BuildState) -> None:
    """Every node with its vector, from the embed pass only: turns their own; derived nodes the
    mean of their turns' token vectors that match their words (when the pass kept token vectors
    and the turn vectors are pooled from them), else the mean of their turns' vectors. After a
    run that only added or removed turns of a published tenant (``state.previous``), the vectors
    of unchanged nodes are copied from it (:mod:`memlib.compose.reuse`)."""
    from memlib.compose.finalize import in_final_order

    nodes = in_final_order(state.all_nodes())
    tv = state.token_vectors
    prev = state.previous
    copied_rows = np.zeros(0, dtype=np.int64)  # rows whose whole published vector was copied
    if prev is not None and tv is not None:
        from memlib.compose.extract_reuse import ensure_changes

        ensure_changes(state)
    if tv is not None and tv.token_ids is not None and state.pooled_turns:
        from memlib.compose.reuse import fallbacks_table, pooled_reusing
        from memlib.embed.tokens_backend import content_tokenizer

        reused = (state.reusing(pooled_reusing, nodes, tv, content_tokenizer(), prev, state.changes)
                  if state.changes is not None else None)
        if reused is not None:
            vectors, fallbacks, sums = reused.vectors, reused.fallbacks, reused.sums
            state.reused_vectors, state.refilled_vectors = reused.copied, reused.refilled
            copied_rows = reused.copied_rows
        else:
            vectors, fallbacks, sums = span_pooled_with_fallbacks(nodes, tv, content_tokenizer())
        if state.beside is not None:  # read by no later step: made beside finalize
            state.beside.hold("node_fallbacks", fallbacks_table, nodes, fallbacks,
                              apply=partial(setattr, state, "fallbacks"))
        else:
            state.fallbacks = fallbacks_table(nodes, fallbacks)
        state.token_sums = sums.table(state.turns.column("tenant_id")[0].as_py()) if state.turns.num_rows else None
    else:
        vectors = pooled_vectors(nodes, state.turns.column("node_id").to_pylist(), state.turn_vectors)
    if state.own_pass is not None and state.own_pass.blend:
        state.own_encoded = blend_own(nodes, vectors, state.own_pass, copied_rows, state.fact_vectors)
    elif state.own_pass is not None:
        state.own_encoded = own_vectors(nodes, vectors, state.own_pass, state.previous)
    state.embedded_nodes = with_embeddings(nodes, vectors, state.dim)
    state.node_vectors = vectors


def blend_own(nodes: pa.Table, vectors: np.ndarray, encode, copied: np.ndarray, kept: pa.Table | None) -> int:
    """Sum the pooled vector of each node of ``encode.kinds`` with the vector of its own text, and
    normalize (memlib.compose.vectors.BLEND_KINDS). Rows in ``copied`` already hold their published
    vector, which is that sum (their pooled part and text did not change). The own vector of a fact
    is the one its session kept (``kept``, schema.FACT_VECTORS: drafted and encoded per session, so
    a nightly run encodes only new sessions' facts); a node without one (a fact of the LLM
    extractor) is encoded here. Returns how many texts were encoded here."""
    rows = np.flatnonzero(pc.is_in(nodes.column("kind"), pa.array(list(encode.kinds), pa.string()))
                          .to_numpy(zero_copy_only=False))
    rows = np.setdiff1d(rows, copied)
    if rows.size == 0:
        return 0
    ids = nodes.column("node_id").take(pa.array(rows, pa.int64())).to_pylist()
    own = np.zeros((rows.size, vectors.shape[1]), dtype=np.float32)
    have = np.zeros(rows.size, dtype=bool)
    if kept is not None and kept.num_rows:
        at = {n: i for i, n in enumerate(kept.column("node_id").to_pylist())}
        found = [(j, at[n]) for j, n in enumerate(ids) if n in at]
        if found:
            j, k = (np.asarray(x, dtype=np.int64) for x in zip(*found))
            flat = pc.list_flatten(kept.column("vector").combine_chunks()).to_numpy(zero_copy_only=False)
            own[j] = flat.reshape(kept.num_rows, -1)[k]
            have[j] = True
    todo = np.flatnonzero(~have)
    if todo.size:
        texts = nodes.column("text").take(pa.array(rows[todo], pa.int64())).to_pylist()
        own[todo] = encode(texts)
    summed = vectors[rows] + own
    vectors[rows] = summed / np.maximum(np.linalg.norm(summed, axis=1, keepdims=True), 1e-12)
    return int(todo.size)


def own_vectors(nodes: pa.Table, vectors: np.ndarray, encode, previous) -> int:
    """Overwrite the rows of ``vectors`` whose node kind the backend embeds by its own text
    (``encode.kinds``) with that vector: copied from the tenant's published build when it has the
    node with the same text (a node id names its text; a nightly run encodes only new nodes),
    else encoded. Returns how many texts were encoded."""
    rows = np.flatnonzero(pc.is_in(nodes.column("kind"), pa.array(list(encode.kinds), pa.string()))
                          .to_numpy(zero_copy_only=False))
    if rows.size == 0:
        return 0
    ids = nodes.column("node_id").take(pa.array(rows)).to_pylist()
    texts = nodes.column("text").take(pa.array(rows)).to_pylist()
    known: dict[tuple[str, str], np.ndarray] = {}
    if previous is not None:
        old = previous.nodes.filter(pc.is_in(previous.nodes.column("node_id"), pa.array(ids, pa.string())))
        if old.num_rows:
            known = dict(zip(zip(old.column("node_id").to_pylist(), old.column("text").to_pylist()),
                             _vectors_of(old)))
    todo = []
    for j, key in enumerate(zip(ids, texts)):
        if key in known:
            vectors[rows[j]] = known[key]
        else:
            todo.append(j)
    if todo:
        vectors[rows[todo]] = encode([texts[j] for j in todo])
    return len(todo)


def _vectors_of(nodes: pa.Table) -> np.ndarray:
    emb = nodes.column("embedding").combine_chunks()
    dim = emb.type.list_size
    return emb.values.to_numpy(zero_copy_only=False).reshape(-1, dim)


def _split_edges(state: BuildState, kind: schema.EdgeKind) -> pa.Table:
    """Remove the edges of ``kind`` from the state and return them (slices of the state's edges
    when they are few runs of rows, as a step's edges are)."""
    edges = state.all_edges()
    mask = pc.equal(edges.column("kind"), kind.value).to_numpy(zero_copy_only=False)
    state.edges = [filter_runs(edges, ~mask)]
    return filter_runs(edges, mask)


def _owns_embeddings(state: BuildState, nodes: pa.Table) -> bool:
    """Whether ``nodes``' embeddings are one chunk, ``state.node_vectors`` itself (embed_nodes)."""
    vec, emb = state.node_vectors, nodes.column("embedding")
    if vec is None or emb.num_chunks != 1 or len(vec) != nodes.num_rows or not vec.flags.c_contiguous:
        return False
    chunk = emb.chunk(0)
    return chunk.offset == 0 and chunk.values.offset == 0 and chunk.values.buffers()[1].address == vec.ctypes.data


def _merged_in_place(state: BuildState, nodes: pa.Table, clue_mask: np.ndarray, merged: pa.Table,
                     merged_vecs: np.ndarray) -> pa.Table:
    """``nodes`` with its clue rows replaced by the merged clues. When the clues are its first rows
    and its embeddings are the embed step's buffer (:func:`memlib.compose.finalize.in_final_order`),
    the merged clues, sorted by node id, take the last rows of the clues' place in that buffer: the
    embeddings stay one chunk already in finalize's order (no sorted copy of them there). Else the
    merged clues follow the other rows."""
    c = int(clue_mask.sum())
    if not (_owns_embeddings(state, nodes) and clue_mask[:c].all()):
        return pa.concat_tables([filter_runs(nodes, ~clue_mask),  # no copy of the vectors
                                 schema.conform(with_embeddings(merged, merged_vecs, state.dim), nodes.schema,
                                                name="clues")])
    order = pc.sort_indices(merged.column("node_id")).to_numpy()
    start = c - merged.num_rows
    buf = state.node_vectors
    buf[start:c] = merged_vecs[order]
    head = schema.conform(with_embeddings(merged.take(pa.array(order)), merged_vecs[order], state.dim),
                          nodes.schema, name="clues")
    table = pa.concat_tables([head, nodes.slice(c)])
    at = table.schema.get_field_index("embedding")
    emb = pa.FixedSizeListArray.from_arrays(pa.array(buf[start:].reshape(-1), pa.float32()), state.dim)
    field = table.schema.field(at)
    return table.set_column(at, field, pa.chunked_array([emb if emb.type == field.type else emb.cast(field.type)]))


def link(state: BuildState) -> None:
    """Merge near-duplicate clues (AssoMem delta) and add SIMILAR edges (gamma) between clues
    and between turns, from the vectors already computed (no new embedding calls)."""
    from memlib.embed.space import backend_threshold
    from memlib.text.clues import merge_clues, merged_vectors, similar_edges

    merge_threshold = backend_threshold(state.cfg.clues.merge_threshold, state.cfg.embed)
    similar_threshold = backend_threshold(state.cfg.clues.similar_threshold, state.cfg.embed)
    nodes = state.embedded_nodes
    clue_mask = pc.equal(nodes.column("kind"), schema.NodeKind.CLUE.value).to_numpy(zero_copy_only=False)
    clue_nodes = filter_runs(nodes, clue_mask)
    if clue_nodes.num_rows:
        vectors = _vectors_of(clue_nodes)
        merged, has_clue, id_map = merge_clues(clue_nodes.drop_columns(["embedding"]), vectors,
                                               merge_threshold, edges=_split_edges(state, schema.EdgeKind.HAS_CLUE))
        new_ids = merged.column("node_id").to_pylist()
        merged_vecs = merged_vectors(id_map, clue_nodes.column("node_id").to_pylist(), vectors, new_ids)
        merged_vecs = np.array(merged_vecs, dtype=np.float32)  # not a view of the rows replaced below
        state.add(edges=has_clue)
        state.add(edges=similar_edges(new_ids, merged.column("tenant_id"), merged_vecs, similar_threshold))
        state.embedded_nodes = _merged_in_place(state, nodes, clue_mask, merged, merged_vecs)
    state.node_vectors = None
    if state.turn_vectors is not None and state.turns.num_rows > 1:
        ids = state.turns.column("node_id")
        similar = None
        if state.changes is not None and state.previous is not None:  # the pairs an added or removed turn changed
            from memlib.text.clues import EarlierEdges, similar_edges_changed

            added = np.flatnonzero(pc.is_in(ids, pa.array(state.changes.added, pa.string()))
                                   .to_numpy(zero_copy_only=False))
            earlier = EarlierEdges(state.previous.similar, added, frozenset(state.changes.removed))
            similar = state.reusing(similar_edges_changed, ids, state.turns.column("tenant_id")[0].as_py(),
                                    state.turn_vectors, similar_threshold, earlier)
        if similar is not None:
            state.add(edges=similar)
        else:
            state.add(edges=similar_edges(ids, state.turns.column("tenant_id"), state.turn_vectors,
                                          similar_threshold))
