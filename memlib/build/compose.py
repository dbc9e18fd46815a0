"""``process_tenant``: the single-process reference composition of the build stages.

Data-flow order (DESIGN.md): turn nodes -> embed turn texts once -> segment (reusing the
turn vectors) -> gate + summaries -> session/segment nodes -> clues -> extraction (facts and
concepts, triplets and entities, events, reflections) -> embed every other node text once
(batched, identical texts deduplicated) -> merge clues / SIMILAR edges with those vectors ->
drop dangling edges (counted) -> conform. ``pipelines/`` runs exactly this per tenant on Ray
workers, so the distributed result equals the single-process one.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from memlib import schema
from memlib.build import stages
from memlib.build.finalize import finalize, kind_counts
from memlib.build.recipe import DEFAULT_RECIPE, BuildStage, get_recipe
from memlib.build.timing import StageTimer
from memlib.build.vectors import PassageEmbedder, VectorCache
from memlib.config import MemlibConfig


@dataclass
class TenantOutput:
    """One tenant's memory: nodes (with embeddings), edges and segments, schema-conformed."""
    tenant_id: str
    nodes: pa.Table
    edges: pa.Table
    segments: pa.Table
    timings: dict[str, float] = field(default_factory=dict)
    dropped_edges: int = 0
    dropped_by_kind: dict[str, int] = field(default_factory=dict)
    texts_embedded: int = 0

    def counts(self) -> dict[str, Any]:
        return {"nodes": self.nodes.num_rows, "edges": self.edges.num_rows,
                "segments": self.segments.num_rows, "nodes_by_kind": kind_counts(self.nodes),
                "edges_by_kind": kind_counts(self.edges), "dropped_edges": self.dropped_edges,
                "dropped_by_kind": self.dropped_by_kind, "texts_embedded": self.texts_embedded}


@dataclass
class BuildState:
    """What the stages of one tenant read and write."""
    turns: pa.Table
    cfg: MemlibConfig
    cache: VectorCache
    nlp: Any = None
    turn_vectors: np.ndarray | None = None
    segments: pa.Table | None = None
    nodes: list[pa.Table] = field(default_factory=list)
    edges: list[pa.Table] = field(default_factory=list)
    facts: pa.Table | None = None
    embedded_nodes: pa.Table | None = None
    extras: dict[str, Any] = field(default_factory=dict)  # backend handles (e.g. the LLM client), per worker

    def add(self, nodes: pa.Table | None = None, edges: pa.Table | None = None) -> None:
        if nodes is not None and nodes.num_rows:
            self.nodes.append(schema.conform(nodes, schema.NODES_NO_EMBEDDING, name="nodes"))
        if edges is not None and edges.num_rows:
            self.edges.append(schema.conform(edges, schema.EDGES, name="edges"))

    def all_nodes(self) -> pa.Table:
        return pa.concat_tables(self.nodes) if self.nodes else schema.empty(schema.NODES_NO_EMBEDDING)

    def all_edges(self) -> pa.Table:
        return pa.concat_tables(self.edges) if self.edges else schema.empty(schema.EDGES)


StepFn = Callable[[BuildState], None]

STEPS: dict[BuildStage, StepFn] = {
    BuildStage.TURN_NODES: stages.turn_nodes,
    BuildStage.EMBED_TURNS: stages.embed_turn_texts,
    BuildStage.SEGMENT: stages.segment,
    BuildStage.GATE: stages.gate,
    BuildStage.STRUCTURE: stages.structure,
    BuildStage.CLUES: stages.clues,
    BuildStage.FACTS: stages.facts,
    BuildStage.TRIPLETS: stages.triplets,
    BuildStage.EVENTS: stages.events,
    BuildStage.REFLECTIONS: stages.reflections,
    BuildStage.EMBED_NODES: stages.embed_nodes,
    BuildStage.LINK: stages.link,
}


def sort_turns(turns: pa.Table) -> pa.Table:
    return turns.sort_by([("tenant_id", "ascending"), ("conversation_id", "ascending"),
                          ("session_index", "ascending"), ("turn_index", "ascending")])


def process_tenant(turns: pa.Table, cfg: MemlibConfig, embedder: PassageEmbedder, nlp: Any = None,
                   recipe: str | Sequence[BuildStage] = DEFAULT_RECIPE,
                   extras: dict[str, Any] | None = None) -> TenantOutput:
    """Build one tenant's memory from its ``schema.TURNS`` rows (all of its sessions).

    ``extras`` reaches every extractor's ``ExtractionContext.extras`` (the caller builds it
    once per worker, e.g. ``pipelines.llm_stage.llm_extras``). The tenant gets a shallow copy: the
    handles in it are shared, but what extractors cache in it (e.g. parsed turns) stays with
    this tenant and never reaches the next tenant built by the same worker."""
    turns = sort_turns(schema.conform(turns, schema.TURNS, name="turns"))
    tenants = set(turns.column("tenant_id").unique().to_pylist())
    if len(tenants) != 1:
        raise ValueError(f"process_tenant needs the turns of exactly one tenant, got {sorted(tenants)}")
    plan = get_recipe(recipe) if isinstance(recipe, str) else tuple(recipe)
    state = BuildState(turns=turns, cfg=cfg, cache=VectorCache(embedder), nlp=nlp,
                       extras=dict(extras) if extras is not None else {})
    timer = StageTimer()
    for stage in plan:
        if stage in STEPS:
            with timer.stage(stage):
                STEPS[stage](state)
    with timer.stage(BuildStage.FINALIZE):
        nodes = state.embedded_nodes if state.embedded_nodes is not None else stages.embed_all(state)
        done = finalize(nodes, state.all_edges(), state.cache.dim)
        segments = schema.conform(state.segments if state.segments is not None else schema.empty(schema.SEGMENTS),
                                  schema.SEGMENTS, name="segments")
    return TenantOutput(tenant_id=tenants.pop(), nodes=done.nodes, edges=done.edges, segments=segments,
                        timings=timer.rounded(), dropped_edges=done.dropped_edges,
                        dropped_by_kind=done.dropped_by_kind, texts_embedded=state.cache.embedded)
