"""The single-process reference composition of the staged build (no Ray here).

A tenant's build is two halves (docs/architecture.md, "Steps, in order"):

1. per session (:mod:`memlib.compose.sessions`): turn nodes -> the embed pass over the turn
   texts (:class:`~memlib.compose.vectors.TurnEncoder`) -> segment -> gate + summaries ->
   session / segment nodes, NEXT / IN_SESSION / IN_SEGMENT edges -> fact and triplet drafts;
2. per tenant (:func:`tenant_steps`), once its sessions are complete: clues (keyphrase IDF
   over the tenant's sessions) -> facts (concepts canonicalized) -> triplets (entities
   canonicalized) -> events -> reflections -> node vectors (pooled from the turn vectors) ->
   merge clues / SIMILAR edges -> drop dangling edges (counted) -> conform; plus the turn order
   of ``auto``'s token matrix, which is the pass's kept token vectors.

:func:`process_tenant` runs both halves in one process. ``pipelines/`` runs the same
functions as Ray Data operators over blocks of sessions of many tenants, keeps each
session's outputs, and must produce exactly what this produces.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.compose import steps
from memlib.compose.beside import BesideSteps
from memlib.compose.finalize import finalize, kind_counts
from memlib.compose.recipe import DEFAULT_RECIPE, Step, get_recipe
from memlib.compose.rows import take_runs
from memlib.compose.sessions import (
    SessionOutput,
    own_encoder,
    session_keys,
    session_local,
    sort_turns,
    split_sessions,
    turn_texts,
)
from memlib.compose.state import BuildState
from memlib.compose.timer import WallTimer
from memlib.compose.vectors import TurnEncoder, TurnVectors, blends
from memlib.compose.vectors import own_pass as make_own_pass
from memlib.config import MemlibConfig
from memlib.extract.base import Extraction


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
    own_encoded: int | None = None  # derived node texts encoded by their own text (None: the backend pools them)
    reused: dict[str, Any] = field(default_factory=dict)  # what was copied from the tenant's previous build
    fallbacks: pa.Table | None = None  # schema.NODE_FALLBACKS (memlib.compose.reuse), when the pass kept token vectors
    token_sums: pa.Table | None = None  # schema.TOKEN_SUMS (memlib.compose.span_pool.IdSums), likewise
    # the turn ids in the order ``auto``'s token matrix holds them (TenantIndex.turn_order), when the
    # embed pass kept token vectors and retrieve.precompute_token_matrices is on: the matrix is those
    # turns' kept token vectors (memlib.retrieve.matrix_cache.reference_row)
    matrix_turns: list[str] | None = None

    def counts(self) -> dict[str, Any]:
        return {"nodes": self.nodes.num_rows, "edges": self.edges.num_rows,
                "segments": self.segments.num_rows, "nodes_by_kind": kind_counts(self.nodes),
                "edges_by_kind": kind_counts(self.edges), "dropped_edges": self.dropped_edges,
                "dropped_by_kind": self.dropped_by_kind, "texts_embedded": self.texts_embedded,
                **({"own_encoded": self.own_encoded} if self.own_encoded is not None else {})}


StepFn = Callable[[BuildState], None]

# tenant-level steps, in data-flow order
TENANT_STEPS: dict[Step, StepFn] = {
    Step.CLUES: steps.clues,
    **{Step(e.value): partial(steps.extract, extraction=e) for e in Extraction},
    Step.EMBED_NODES: steps.embed_nodes,
    Step.LINK: steps.link,
}


def _in_session_order(table: pa.Table, order: pa.Array) -> pa.Table:
    """Rows grouped by session in the tenant's session order (``order``: its session keys, each
    once), row order kept within a session; a table in that order already is returned as it is."""
    if table.num_rows == 0:
        return table
    rank = pc.index_in(table.column("session_key"), value_set=order).fill_null(len(order))
    rank = rank.to_numpy(zero_copy_only=False)
    if rank.size < 2 or bool((np.diff(rank) >= 0).all()):
        return table
    # a new session in a kept block's range moves as one run of rows: zero-copy slices (rows.take_runs)
    return take_runs(table, np.argsort(rank, kind="stable"))


def _in_turn_order(vectors: TurnVectors, turn_ids: list[str]) -> np.ndarray:
    """The turn vectors in the order of ``turn_ids``: ``vectors.vectors`` itself (not a copy) when
    they are in that order already, as the pass gives them (read only by the steps)."""
    if list(vectors.node_ids) == turn_ids:
        return vectors.vectors
    row = {n: i for i, n in enumerate(vectors.node_ids)}
    missing = [n for n in turn_ids if n not in row]
    if missing:
        raise ValueError(f"no turn vector for {len(missing)} turn(s), e.g. {missing[0]}")
    return vectors.vectors[[row[n] for n in turn_ids]]


def _pooled_backend(cfg: MemlibConfig) -> bool:
    """Whether the turn vectors are the mean of the kept token vectors (same encoder)."""
    from memlib.compose.vectors import auto_encoder_model
    from memlib.embed.registry import EmbedBackend, parse_backend
    from memlib.embed.token_model import DEFAULT_MODEL

    return parse_backend(cfg.embed.backend) is EmbedBackend.MINILM_TOKENS and auto_encoder_model(cfg) == DEFAULT_MODEL


def matrix_turns(turns: pa.Table, vectors: TurnVectors) -> list[str] | None:
    """The tenant's turn ids in the order ``auto``'s token matrix holds them (conversation order,
    as a TenantIndex reads them), or None when the pass kept no token vectors."""
    if vectors.token_ids is None or vectors.token_vectors is None:
        return None
    return turns.sort_by([("session_index", "ascending"), ("turn_index", "ascending")]).column("node_id").to_pylist()


@dataclass
class TenantSessions:
    """A tenant's input to its tenant-level steps: its turns, every session's outputs (``parts``,
    any order) and turn vectors, its session keys in session order, and its published build under
    the same build key (:func:`memlib.compose.reuse.load_previous`), whose unchanged parts are
    reused when this run only added or removed turns (the output is the same either way)."""
    turns: pa.Table
    parts: SessionOutput
    vectors: TurnVectors
    order: Sequence[str]
    previous: Any = None


@dataclass
class StepTools:
    """What a worker loads once for all its tenants: spaCy (``nlp``), what reaches every
    extractor's ``ExtractionContext.extras`` (e.g. ``pipelines.llm_actors.llm_extras``), and the
    encoder of the derived kinds embedded by their own text (``own_pass``:
    :func:`memlib.compose.vectors.own_pass`; None: no node gets a vector of its own text)."""
    nlp: Any = None
    extras: dict[str, Any] | None = None
    own_pass: Any = None


def tenant_steps(tenant: TenantSessions, cfg: MemlibConfig, recipe: str | Sequence[Step] = DEFAULT_RECIPE,
                 tools: StepTools | None = None) -> TenantOutput:
    """The tenant-level half: every session's outputs and turn vectors of one tenant -> its memory.
    The clue step and the embed step's ``node_fallbacks`` table run on a side thread beside the
    other steps (:mod:`memlib.compose.beside`); the output is the same as in sequence."""
    tools = tools or StepTools()
    turns, parts, vectors, session_order, previous = (tenant.turns, tenant.parts, tenant.vectors, tenant.order,
                                                      tenant.previous)
    nlp, extras, own_pass = tools.nlp, tools.extras, tools.own_pass
    turns = sort_turns(schema.conform(turns, schema.TURNS, name="turns"))
    tenants = set(turns.column("tenant_id").unique().to_pylist())
    if len(tenants) != 1:
        raise ValueError(f"tenant_steps needs the turns of exactly one tenant, got {sorted(tenants)}")
    plan = get_recipe(recipe) if isinstance(recipe, str) else tuple(recipe)
    order = {k: i for i, k in enumerate(session_order)}
    timer = WallTimer()
    dim = int(vectors.vectors.shape[1]) if vectors.vectors.ndim == 2 else int(cfg.embed.dim)
    state = BuildState(turns=turns, cfg=cfg, dim=dim, nlp=nlp, extras=dict(extras) if extras is not None else {},
                       turn_vectors=_in_turn_order(vectors, turns.column("node_id").to_pylist()),
                       token_vectors=vectors, pooled_turns=_pooled_backend(cfg), previous=previous,
                       own_pass=own_pass)
    keys = pa.array(list(order), pa.string())
    keyed = {name: _in_session_order(parts.table(name), keys) for name in parts.tables}
    state.add(keyed["nodes"].drop_columns(["session_key"]), keyed["edges"].drop_columns(["session_key"]))
    if keyed["segments"].num_rows:
        state.segments = schema.conform(keyed["segments"], schema.SEGMENTS, name="segments")
    state.drafts = {k: keyed[k] for k in ("fact_drafts", "entity_mentions", "triplet_drafts", "clue_drafts")}
    state.fact_vectors = keyed["fact_vectors"]
    state.beside = BesideSteps()
    try:
        done, segments = _run_steps(state, plan, timer)
    except BaseException:
        state.beside.raise_first()  # a side step's error first: the steps ran after it only beside it
        raise
    finally:
        state.beside.close()
    timer.merge(state.beside.seconds)
    return TenantOutput(tenant_id=tenants.pop(), nodes=done.nodes, edges=done.edges, segments=segments,
                        timings=timer.rounded(), dropped_edges=done.dropped_edges,
                        dropped_by_kind=done.dropped_by_kind, texts_embedded=len(vectors.node_ids) + state.own_encoded,
                        own_encoded=state.own_encoded if own_pass is not None else None,
                        matrix_turns=matrix_turns(turns, vectors) if cfg.retrieve.precompute_token_matrices else None,
                        reused=_reused(state), fallbacks=state.fallbacks, token_sums=state.token_sums)


# the steps that read no clue row and change nothing the clue step reads (the clue drafts, the
# segments, the config): the clue step runs beside them. Of ``state.nodes`` they read only the turn
# rows (the facts and triplets steps' reuse: memlib.compose.extract_reuse)
BESIDE_CLUES = frozenset({Step.FACTS, Step.TRIPLETS, Step.EVENTS, Step.REFLECTIONS})


def _run_steps(state: BuildState, plan: Sequence[Step], timer: WallTimer) -> tuple[Any, pa.Table]:
    """The tenant steps of ``plan`` in order, then finalize. The clue step runs on the side thread
    (:class:`~memlib.compose.beside.BesideSteps`) beside the steps of :data:`BESIDE_CLUES` after it;
    its rows take their place in ``state`` before the first other step, so the state holds the
    same tables in the same order as when it runs in sequence."""
    beside = state.beside
    for stage in plan:
        if stage not in TENANT_STEPS:
            continue
        if stage is Step.CLUES:
            at = len(state.nodes), len(state.edges)
            beside.start(Step.CLUES.value, steps.clue_tables, state, apply=partial(_insert, state, at))
            continue
        if stage not in BESIDE_CLUES:
            beside.join(Step.CLUES.value)
        with timer.span(stage):
            TENANT_STEPS[stage](state)
    beside.join(Step.CLUES.value)
    with timer.span(Step.FINALIZE):
        if state.embedded_nodes is None:
            steps.embed_nodes(state)
        # held till here: beside the link step it slows that step's BLAS and Python parts more
        # than it saves; finalize holds the GIL for little of its time
        beside.release()
        done = finalize(state.embedded_nodes, state.all_edges(), dim=state.dim)
        segments = schema.conform(state.segments if state.segments is not None else schema.empty(schema.SEGMENTS),
                                  schema.SEGMENTS, name="segments")
    beside.join()
    return done, segments


def _insert(state: BuildState, at: tuple[int, int], tables: tuple[pa.Table, pa.Table]) -> None:
    """``state.add`` of a side step's nodes and edges, at the place they had when it started."""
    grown = BuildState(turns=state.turns, cfg=state.cfg, dim=state.dim)
    grown.add(*tables)
    state.nodes[at[0]:at[0]] = grown.nodes
    state.edges[at[1]:at[1]] = grown.edges


def _reused(state: BuildState) -> dict[str, Any]:
    if state.previous is None:
        return {}
    if state.reuse_error is not None:  # the published build could not be reused: the steps ran in full
        return {"appended_only": 0, "error": state.reuse_error}
    if state.changes is None:  # a published turn changed: every step ran over the whole tenant
        return {"appended_only": 0}
    removed = {"removed_turns": len(state.changes.removed)} if state.changes.removed else {}
    return {"appended_only": int(not removed), "appended_turns": len(state.changes.added), **removed,
            "node_vectors": state.reused_vectors, "node_vectors_refilled": state.refilled_vectors,
            **state.extract_reuse}


def prepare_tenant_steps(cfg: MemlibConfig, recipe: str | Sequence[Step] = DEFAULT_RECIPE,
                         kernels: bool = True) -> None:
    """Import now what :func:`tenant_steps` would import on its first tenant: the extractors of
    the configured backends and the modules of the tenant steps (a worker calls it when it starts,
    while the sessions of its first tenant are still being computed). ``kernels``: also numba's
    pooling loops (:func:`memlib.compose.pool_kernels.warm`), for a run that pools whole tenants
    (a full build); a nightly that appends pools a few rows in numpy and never imports numba."""
    from memlib.compose import pool_kernels
    from memlib.extract.base import backend_of, configured, get_extractor
    from memlib.text import clues  # noqa: F401 - imported for its load time

    if kernels:
        pool_kernels.warm()

    plan = get_recipe(recipe) if isinstance(recipe, str) else tuple(recipe)
    for extraction in configured(cfg):
        if Step(extraction.value) in plan:
            get_extractor(extraction, backend_of(cfg, extraction))


def embed_turns(turns: pa.Table, keys: pa.Array, cfg: MemlibConfig, encoder: TurnEncoder) -> TurnVectors:
    """The embed pass over ``turns`` (what the Ray embed operator runs on a block)."""
    return encoder.encode(turns.column("node_id").to_pylist(), turn_texts(turns, cfg).to_pylist())


def process_tenant(turns: pa.Table, cfg: MemlibConfig, encoder: TurnEncoder, *,
                   recipe: str | Sequence[Step] = DEFAULT_RECIPE, previous: Any = None,
                   tools: StepTools | None = None) -> TenantOutput:
    """Build one tenant's memory from its ``schema.TURNS`` rows, in one process: every session
    through the session-local stages, then the tenant-level stages.

    ``tools``: spaCy and the extractors' extras, loaded once per worker (its ``own_pass`` is made
    here, from ``encoder``); ``previous``: as in :class:`TenantSessions`. Session keys are made
    under an empty build key: this build keeps no session outputs, its keys only order the sessions."""
    tools = tools or StepTools()
    turns = sort_turns(schema.conform(turns, schema.TURNS, name="turns"))
    plan = get_recipe(recipe) if isinstance(recipe, str) else tuple(recipe)
    timer = WallTimer()
    parts, vecs, order, nlp = [], [], [], tools.nlp
    own = own_encoder(cfg, plan, encoder)
    for session in split_sessions(turns):
        key = session_keys(session, "")[0].as_py()
        with timer.span(Step.EMBED_TURNS):
            tv = embed_turns(session, session_keys(session, ""), cfg, encoder)
        with timer.span("session_local"):
            out, nlp = session_local((session, tv.vectors, key), cfg, plan, nlp, own)
        parts.append(out)
        vecs.append(tv)
        order.append(key)
    merged = TurnVectors.concat(vecs, cfg.embed.dim)
    out = tenant_steps(TenantSessions(turns, SessionOutput.concat(parts), merged, order, previous), cfg, plan,
                       StepTools(nlp, tools.extras, make_own_pass(cfg, encoder if blends(cfg) else encoder.passages)))
    out.timings = {**timer.rounded(), **out.timings}
    return out
