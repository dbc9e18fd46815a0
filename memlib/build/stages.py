"""The step behind each :class:`~memlib.build.recipe.BuildStage`: a thin call into the
memlib stage function that owns the work, reading and writing a ``BuildState``.

Stage modules are imported inside each step, so a recipe that leaves a stage out never
loads its dependencies (spaCy, dateparser, ...).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.build.vectors import with_embeddings

if TYPE_CHECKING:
    from memlib.build.compose import BuildState


def _of_kind(nodes: pa.Table, *kinds: schema.NodeKind) -> pa.Table:
    return nodes.filter(pc.is_in(nodes.column("kind"), value_set=pa.array([k.value for k in kinds])))


def _turn_node_table(state: BuildState) -> pa.Table:
    nodes = state.all_nodes()
    return _of_kind(nodes, schema.NodeKind.TURN)


def turn_nodes(state: BuildState) -> None:
    from memlib.text.structure import turn_nodes as make_turn_nodes

    state.add(make_turn_nodes(state.turns, state.cfg.io.image_caption_in_text))


def embed_turn_texts(state: BuildState) -> None:
    """Embed the turn nodes' texts once; ``turn_vectors`` follows the row order of ``turns``."""
    tn = _turn_node_table(state)
    by_id = dict(zip(tn.column("node_id").to_pylist(), tn.column("text").to_pylist()))
    texts = [by_id[n] for n in state.turns.column("node_id").to_pylist()]
    state.turn_vectors = state.cache.get(texts)


def segment(state: BuildState) -> None:
    from memlib.text.segment import segment_turns

    state.segments = segment_turns(state.turns, state.turn_vectors, state.cfg.segment)


def gate(state: BuildState) -> None:
    from memlib.text.gate import gate_turns

    state.segments = gate_turns(state.turns, state.segments, state.cfg.gate)


def structure(state: BuildState) -> None:
    """Session nodes, NEXT + IN_SESSION edges; segment nodes + IN_SEGMENT edges when segmented."""
    from memlib.text import structure as st

    state.add(st.session_nodes(state.turns, state.segments), st.structure_edges(state.turns))
    if state.segments is not None and state.segments.num_rows:
        from memlib.text.segment import segment_nodes_edges

        state.add(*segment_nodes_edges(state.segments, state.turns))


def clues(state: BuildState) -> None:
    from memlib.text.clues import session_clues

    state.add(*session_clues(state.turns, state.segments, state.cfg.clues))


def kept_turn_ids(state: BuildState) -> frozenset[str] | None:
    if state.segments is None or state.segments.num_rows == 0:
        return None
    if state.segments.column("kept_turn_ids").null_count == state.segments.num_rows:
        return None  # not gated: every turn is kept
    kept = pc.list_flatten(state.segments.column("kept_turn_ids"))
    return frozenset(kept.to_pylist())


def _extract(state: BuildState, stage_name: str) -> None:
    from memlib.extract.base import ExtractionContext, get_extractor

    backend = getattr(state.cfg, stage_name).backend
    ctx = ExtractionContext(turns=state.turns, kept_turn_ids=kept_turn_ids(state), config=state.cfg,
                            nlp=state.nlp, facts=state.facts, extras=state.extras)
    result = get_extractor(stage_name, backend).run(ctx).conformed(stage_name)
    state.nlp = ctx.nlp  # loaded once, reused by the next stage
    state.add(result.nodes, result.edges)
    if stage_name == "facts":
        state.facts = result.nodes


def facts(state: BuildState) -> None:
    _extract(state, "facts")


def triplets(state: BuildState) -> None:
    _extract(state, "triplets")


def events(state: BuildState) -> None:
    _extract(state, "events")


def reflections(state: BuildState) -> None:
    if state.cfg.reflections.enabled:
        _extract(state, "reflections")


def embed_all(state: BuildState) -> pa.Table:
    """Every node with its embedding: turn vectors reused, other distinct texts embedded once."""
    nodes = state.all_nodes()
    texts = pc.fill_null(nodes.column("text"), "").to_pylist()
    return with_embeddings(nodes, state.cache.get(texts), state.cache.dim)


def embed_nodes(state: BuildState) -> None:
    state.embedded_nodes = embed_all(state)


def _vectors_of(nodes: pa.Table) -> np.ndarray:
    emb = nodes.column("embedding").combine_chunks()
    dim = emb.type.list_size
    return emb.values.to_numpy(zero_copy_only=False).reshape(-1, dim)


def _split_edges(state: BuildState, kind: schema.EdgeKind) -> pa.Table:
    """Remove the edges of ``kind`` from the state and return them."""
    edges = state.all_edges()
    mask = pc.equal(edges.column("kind"), kind.value)
    state.edges = [edges.filter(pc.invert(mask))]
    return edges.filter(mask)


def link(state: BuildState) -> None:
    """Merge near-duplicate clues (AssoMem delta) and add SIMILAR edges (gamma) between clues
    and between turns, from the vectors already computed (no new embedding calls)."""
    from memlib.text.clues import merge_clues, merged_vectors, similar_edges

    cfg = state.cfg.clues
    nodes = state.embedded_nodes
    clue_mask = pc.equal(nodes.column("kind"), schema.NodeKind.CLUE.value)
    clue_nodes = nodes.filter(clue_mask)
    if clue_nodes.num_rows:
        vectors = _vectors_of(clue_nodes)
        merged, has_clue, id_map = merge_clues(clue_nodes.drop_columns(["embedding"]), vectors,
                                               cfg.merge_threshold, edges=_split_edges(state, schema.EdgeKind.HAS_CLUE))
        new_ids = merged.column("node_id").to_pylist()
        merged_vecs = merged_vectors(id_map, clue_nodes.column("node_id").to_pylist(), vectors, new_ids)
        merged = with_embeddings(merged, merged_vecs, state.cache.dim)
        state.embedded_nodes = pa.concat_tables([nodes.filter(pc.invert(clue_mask)),
                                                 schema.conform(merged, nodes.schema, name="clues")])
        state.add(edges=has_clue)
        state.add(edges=similar_edges(new_ids, merged.column("tenant_id"), merged_vecs, cfg.similar_threshold))
    if state.turn_vectors is not None and state.turns.num_rows > 1:
        state.add(edges=similar_edges(state.turns.column("node_id"), state.turns.column("tenant_id"),
                                      state.turn_vectors, cfg.similar_threshold))
