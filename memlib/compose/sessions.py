"""Session-local half of the build: what one session yields on its own.

A session's outputs depend only on its own turns, the build key and its turn vectors, so
they are kept per session (keyed by :func:`session_keys`) and a nightly run recomputes only
new or changed sessions. The stages (data-flow order; inputs -> outputs):

==================  ===================================  ======================================
stage               reads                                writes
==================  ===================================  ======================================
turn_nodes          TURNS                                nodes (turn)
embed (operator)    turn node texts                      TURN_VECTORS (vector, token ids/vectors)
segment             TURNS, TURN_VECTORS.vector           SEGMENTS (turn_ids)
gate                TURNS, SEGMENTS                      SEGMENTS (kept_turn_ids, summary)
structure           TURNS, SEGMENTS                      nodes (session, segment); edges (NEXT,
                                                         IN_SESSION, IN_SEGMENT)
clues (draft)       TURNS, SEGMENTS (kept turns)         CLUE_DRAFTS (RAKE-scored keyphrase candidates)
facts (draft)       kept TURNS (spaCy)                   FACT_DRAFTS; FACT_VECTORS (default embedder:
                                                         each draft's own text, encoded alone)
triplets (draft)    kept TURNS (spaCy)                   ENTITY_MENTIONS, TRIPLET_DRAFTS
==================  ===================================  ======================================

Every function here takes the turns of exactly one session, so a session's output is the
same whichever block of sessions it travels in. The tenant-level half is
:func:`memlib.compose.reference.tenant_steps`.
"""
from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from memlib import ids, schema
from memlib.compose.recipe import Step
from memlib.config import Backend, MemlibConfig

SESSION_COLUMNS = ["tenant_id", "conversation_id", "session_id"]
# the columns of a turn that decide its session's outputs
_HASHED = ["tenant_id", "conversation_id", "session_id", "session_index", "session_time", "turn_id",
           "turn_index", "node_id", "speaker", "role", "text", "extras"]

# what one session keeps: table name -> schema (each row also carries its session_key)
SESSION_TABLES: dict[str, pa.Schema] = {
    "nodes": schema.NODES_NO_EMBEDDING,
    "edges": schema.EDGES,
    "segments": schema.SEGMENTS,
    "fact_drafts": schema.FACT_DRAFTS,
    "entity_mentions": schema.ENTITY_MENTIONS,
    "triplet_drafts": schema.TRIPLET_DRAFTS,
    "clue_drafts": schema.CLUE_DRAFTS,
    "fact_vectors": schema.FACT_VECTORS,
}
# the heuristic extractors split into a session-local draft and a tenant-level finish; other
# backends (LLM) run whole at tenant level, where the LLM response cache makes reruns cheap
DRAFTED = (Step.FACTS, Step.TRIPLETS)


def sort_turns(turns: pa.Table) -> pa.Table:
    return turns.sort_by([("tenant_id", "ascending"), ("conversation_id", "ascending"),
                          ("session_index", "ascending"), ("turn_index", "ascending")])


def session_keys(turns: pa.Table, build_key: str) -> pa.Array:
    """Per turn row: the key of its session = sha256 of the build key and every hashed column of
    the session's turns in order (so any edit, insertion or deletion in it changes the key)."""
    ordered = sort_turns(turns).select(_HASHED)
    blobs = _session_blobs(ordered, _joined_rows(ordered))
    if blobs is None:  # a value holding a byte to escape (or an unusual column type): value by value
        rows = [ids.join_escaped([("" if v is None else str(v)).encode("utf-8", "surrogatepass") for v in row])
                for row in pl.from_arrow(ordered).iter_rows()]
        blobs = _session_blobs(ordered, rows, check=False)
    seed = hashlib.sha256(build_key.encode("utf-8"))
    keyed = {}
    for session, blob in blobs.items():
        h = seed.copy()
        h.update(blob)
        keyed[session] = h.hexdigest()[:32]
    return pa.array([keyed[r] for r in zip(*(turns.column(c).to_pylist() for c in SESSION_COLUMNS))], pa.string())


def _session_blobs(ordered: pa.Table, rows: list[bytes] | None, check: bool = True) -> dict[tuple, bytes] | None:
    """Session -> what its key hashes: its ``rows`` (sorted order), each after a record separator.
    With ``check``, None when a row's values hold a byte that :func:`memlib.ids.join_escaped` escapes
    (the rows were joined unescaped): every row must then have exactly its separators."""
    if rows is None:
        return None
    sessions: dict[tuple, list[bytes]] = {}
    for session, row in zip(zip(*(ordered.column(c).to_pylist() for c in SESSION_COLUMNS)), rows):
        sessions.setdefault(session, []).append(row)
    seps = len(_HASHED) - 1
    out = {}
    for session, parts in sessions.items():
        blob = out[session] = b"\x1e" + b"\x1e".join(parts)
        if check and (blob.count(b"\x1f") != seps * len(parts) or blob.count(b"\x1e") != len(parts)
                      or b"\x00" in blob or b"\x1b" in blob):
            return None
    return out


def _joined_rows(table: pa.Table) -> list[bytes] | None:
    """Each row's values as text (None as empty; a time as ``str(datetime)``) joined by the unit
    separator, by Arrow (what ``ids.join_escaped`` gives when no value holds a byte to escape);
    None when a column is of another type."""
    texts = []
    for col in table.columns:
        if pa.types.is_string(col.type):
            texts.append(col)
        elif pa.types.is_integer(col.type):
            texts.append(col.cast(pa.string()))
        elif pa.types.is_timestamp(col.type):  # few distinct times (one a session): formatted by Python
            distinct = pc.unique(col)
            shown = pa.array(["" if v is None else str(v) for v in distinct.to_pylist()], pa.string())
            texts.append(shown.take(pc.index_in(col, value_set=distinct)))
        else:
            return None
    joined = pc.binary_join_element_wise(*texts, "\x1f", null_handling="replace", null_replacement="")
    return joined.cast(pa.binary()).to_pylist()


def split_sessions(turns: pa.Table) -> list[pa.Table]:
    """The turns of each session, in (tenant, conversation, session_index) order."""
    turns = sort_turns(turns)
    df = pl.from_arrow(turns.select(SESSION_COLUMNS)).with_row_index("_r")
    out = []
    for _, part in df.group_by(SESSION_COLUMNS, maintain_order=True):
        idx = part["_r"].to_numpy()
        out.append(turns.slice(int(idx[0]), len(idx)))
    return out


@dataclass
class SessionOutput:
    """Session-local tables (see :data:`SESSION_TABLES`), each row tagged with its session_key."""
    tables: dict[str, pa.Table] = field(default_factory=dict)

    def table(self, name: str) -> pa.Table:
        table = self.tables.get(name)
        return table if table is not None else _empty_keyed(name)

    @staticmethod
    def concat(parts: Sequence[SessionOutput]) -> SessionOutput:
        out = {}
        for name in SESSION_TABLES:
            tables = [p.table(name) for p in parts if p.table(name).num_rows]
            out[name] = pa.concat_tables(tables) if tables else _empty_keyed(name)
        return SessionOutput(out)


@functools.cache
def keyed_schema(name: str) -> pa.Schema:
    base = SESSION_TABLES[name]
    if "session_key" in base.names:
        return base
    return pa.schema([pa.field("session_key", pa.string(), nullable=False), *base])


def _empty_keyed(name: str) -> pa.Table:
    return schema.empty(keyed_schema(name))


def _keyed(table: pa.Table, name: str, key: str) -> pa.Table:
    table = schema.conform(table, SESSION_TABLES[name], name=name)
    if "session_key" not in table.column_names:
        table = table.add_column(0, "session_key", pa.array([key] * table.num_rows, pa.string()))
    return schema.conform(table, keyed_schema(name), name=name)


def _kept_turn_ids(segments: pa.Table | None) -> frozenset[str] | None:
    if segments is None or segments.num_rows == 0:
        return None
    if segments.column("kept_turn_ids").null_count == segments.num_rows:
        return None
    return frozenset(pc.list_flatten(segments.column("kept_turn_ids")).to_pylist())


def session_local(session: tuple[pa.Table, np.ndarray, str], cfg: MemlibConfig, plan: Sequence[Step],
                  nlp: Any = None, own: Any = None) -> tuple[SessionOutput, Any]:
    """The session-local stages of one session: ``(turns, vectors, key)``, its rows in turn order,
    its turn vectors in the same order and its session key. Returns the output and the spaCy
    pipeline (loaded on first use, to be passed back in for the next session). ``own``: the
    encoder of the fact drafts' own texts (:func:`memlib.compose.vectors.own_pass` of the default
    embedder), else None."""
    outputs, nlp = sessions_local([session], cfg, plan, nlp, own)
    return outputs[0], nlp


def sessions_local(sessions: Sequence[tuple[pa.Table, np.ndarray, str]], cfg: MemlibConfig,
                   plan: Sequence[Step], nlp: Any = None, own: Any = None) -> tuple[list[SessionOutput], Any]:
    """:func:`session_local` of several sessions (``(turns, vectors, key)`` each), their kept
    turns parsed by spaCy in one call (:func:`memlib.extract.parse.parse_contexts`); each
    session's output is the same as alone (a fact's own vector too: each text is encoded alone)."""
    staged = [_structure(turns, vectors, cfg, plan) for turns, vectors, _ in sessions]
    drafted = _drafted(cfg, plan)
    if drafted:
        from memlib.extract.base import ExtractionContext, get_extractor
        from memlib.extract.parse import parse_contexts

        ctxs = [ExtractionContext(turns=turns, kept_turn_ids=_kept_turn_ids(out["segments"]), config=cfg, nlp=nlp)
                for (turns, _, _), out in zip(sessions, staged)]
        parse_contexts(ctxs)
        facts, triplets = get_extractor("facts", Backend.HEURISTIC), get_extractor("triplets", Backend.HEURISTIC)
        for ctx, (_, _, key), out in zip(ctxs, sessions, staged):
            if Step.FACTS in drafted:
                out["fact_drafts"] = facts.draft(ctx, key)
                if own is not None:
                    out["fact_vectors"] = fact_vectors(out["fact_drafts"], own)
            if Step.TRIPLETS in drafted:
                out["entity_mentions"], out["triplet_drafts"] = triplets.draft(ctx, key)
            nlp = ctx.nlp
    outputs = [SessionOutput({name: _keyed(t, name, key) for name, t in out.items()})
               for (_, _, key), out in zip(sessions, staged)]
    return outputs, nlp


def fact_vectors(drafts: pa.Table, own: Any) -> pa.Table:
    """:data:`schema.FACT_VECTORS` of fact drafts: each draft's own text through ``own``."""
    if drafts.num_rows == 0:
        return schema.empty(schema.FACT_VECTORS)
    vectors = np.ascontiguousarray(own(drafts.column("text").to_pylist()), dtype=np.float32)
    offsets = pa.array(np.arange(0, vectors.size + 1, max(vectors.shape[1], 1), dtype=np.int32))
    column = pa.ListArray.from_arrays(offsets, pa.array(vectors.reshape(-1), pa.float32()))
    return pa.table({"node_id": drafts.column("node_id"), "vector": column}, schema=schema.FACT_VECTORS)


def own_encoder(cfg: MemlibConfig, plan: Sequence[Step], encoder: Any = None) -> Any:
    """The encoder of fact drafts' own texts for :func:`sessions_local`: the default embedder's
    turn-vector rule (:class:`memlib.compose.vectors.OwnPass`, ``encoder`` or loaded at first use)
    when facts are drafted per session; None otherwise (another embedder embeds facts by their own
    text at tenant level)."""
    from memlib.compose.vectors import blends, own_pass

    return own_pass(cfg, encoder) if blends(cfg) and Step.FACTS in _drafted(cfg, plan) else None


def _structure(turns: pa.Table, vectors: np.ndarray, cfg: MemlibConfig, plan: Sequence[Step]) -> dict[str, pa.Table]:
    """A session's stages before extraction: turn, session and segment nodes and their edges,
    segments (gated), clue drafts."""
    from memlib.text import structure as st

    nodes = [st.turn_nodes(turns, cfg.io.image_caption_in_text)]
    edges = [st.structure_edges(turns)]
    segments = None
    if Step.SEGMENT in plan:
        from memlib.text.segment import segment_turns

        segments = segment_turns(turns, vectors, cfg.segment)
        if Step.GATE in plan:
            from memlib.text.gate import gate_turns

            segments = gate_turns(turns, segments, cfg.gate)
    nodes.append(st.session_nodes(turns, segments))
    if segments is not None and segments.num_rows:
        from memlib.text.segment import segment_nodes_edges

        seg_nodes, seg_edges = segment_nodes_edges(segments, turns)
        nodes.append(seg_nodes)
        edges.append(seg_edges)
    out = {"nodes": pa.concat_tables([schema.conform(n, schema.NODES_NO_EMBEDDING) for n in nodes]),
           "edges": pa.concat_tables([schema.conform(e, schema.EDGES) for e in edges]),
           "segments": segments if segments is not None else schema.empty(schema.SEGMENTS)}
    if Step.CLUES in plan:
        from memlib.text.clues import clue_drafts

        out["clue_drafts"] = clue_drafts(turns, segments)
    return out


def _drafted(cfg: MemlibConfig, plan: Sequence[Step]) -> list[Step]:
    """The steps of ``plan`` whose extractor drafts per session (a heuristic backend)."""
    return [s for s in DRAFTED if s in plan and getattr(cfg, s.value).backend == Backend.HEURISTIC]


def prepare(cfg: MemlibConfig, plan: Sequence[Step]) -> Any:
    """Load now what :func:`session_local` would load on its first session: the modules of its
    steps, the drafted extractors and the spaCy pipeline they parse with (returned; None when
    no step parses). A worker calls it when it starts, so the first session it gets waits for
    none of it."""
    from memlib.text import gate, segment, structure  # noqa: F401 - imported for their load time

    drafted = _drafted(cfg, plan)
    if not drafted:
        return None
    from memlib.extract.base import get_extractor
    from memlib.text.nlp import load_nlp

    for step in drafted:
        get_extractor(step.value, Backend.HEURISTIC)
    return load_nlp(cfg.triplets.spacy_model)


def turn_texts(turns: pa.Table, cfg: MemlibConfig) -> pa.Array:
    """The text of each turn's node (what the encoder sees), row-aligned with ``turns``."""
    from memlib.text.structure import index_texts

    return index_texts(turns, cfg.io.image_caption_in_text)
