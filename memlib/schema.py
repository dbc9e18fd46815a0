"""Arrow schemas of every memlib table, in one place.

Every stage returns a table that conforms to one of these schemas; ``conform`` casts
and orders columns and fails loudly on a missing one. Tables are plain Parquet/Lance
and can be read by polars or duckdb without memlib.

Conventions
-----------
* ``node_id`` values are deterministic content hashes (see :mod:`memlib.ids`) of the
  form ``"<kind>:<hex>"``.
* ``provenance`` columns hold *turn node ids* (``turn:<hex>``); the ``turns`` table maps
  them back to the source ``turn_id`` (e.g. ``D1:3``), session and time.
* Times are UTC timestamps in microseconds.
"""
from __future__ import annotations

from enum import Enum

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")
DEFAULT_EMBED_DIM = 384


def required(*names: str) -> list[pa.Field]:
    """Non-null string columns, in the order given (the ids every table starts with)."""
    return [pa.field(name, pa.string(), nullable=False) for name in names]


class NodeKind(str, Enum):
    TURN = "turn"
    SEGMENT = "segment"
    SESSION = "session"
    CLUE = "clue"
    CONCEPT = "concept"
    FACT = "fact"
    REFLECTION = "reflection"
    ENTITY = "entity"
    EVENT = "event"
    TRIPLET = "triplet"


class EdgeKind(str, Enum):
    NEXT = "NEXT"                        # turn -> next turn in its session
    IN_SEGMENT = "IN_SEGMENT"            # turn -> segment
    IN_SESSION = "IN_SESSION"            # turn/segment -> session
    HAS_CLUE = "HAS_CLUE"                # session/segment -> clue
    HAS_CONCEPT = "HAS_CONCEPT"          # turn -> concept
    ABOUT_CONCEPT = "ABOUT_CONCEPT"      # fact -> concept
    DERIVED_FROM = "DERIVED_FROM"        # fact/event/triplet -> turn
    DERIVED_FROM_FACT = "DERIVED_FROM_FACT"  # reflection -> fact
    MENTIONS = "MENTIONS"                # turn/fact -> entity
    RELATION = "RELATION"                # entity -> entity (labelled)
    SIMILAR = "SIMILAR"                  # clue<->clue, turn<->turn
    CAUSES = "CAUSES"                    # event -> event
    SUPERSEDES = "SUPERSEDES"            # new fact -> outdated fact


class Role(str, Enum):
    USER = "user"
    ASSISTANT = "assistant"
    OTHER = "other"


class Source(str, Enum):
    HEURISTIC = "heuristic"
    HEURISTIC_FALLBACK = "heuristic-fallback"
    INPUT = "input"


TURNS = pa.schema([
    *required("tenant_id", "conversation_id", "session_id"),
    pa.field("session_index", pa.int32(), nullable=False),
    pa.field("session_time", TS),
    pa.field("turn_id", pa.string(), nullable=False),
    pa.field("turn_index", pa.int32(), nullable=False),
    pa.field("node_id", pa.string(), nullable=False),
    pa.field("speaker", pa.string()),
    *required("role", "text", "content_hash"),
    pa.field("extras", pa.string()),  # JSON object as a string (e.g. image captions)
])

SEGMENTS = pa.schema([
    *required("segment_id", "tenant_id", "conversation_id", "session_id"),
    pa.field("segment_index", pa.int32(), nullable=False),
    pa.field("turn_ids", pa.list_(pa.string())),       # turn node ids, in order
    pa.field("kept_turn_ids", pa.list_(pa.string())),  # passed the memory gate
    pa.field("summary", pa.string()),
    pa.field("session_time", TS),
])


def nodes_schema(dim: int = DEFAULT_EMBED_DIM) -> pa.Schema:
    return pa.schema([
        *required("node_id", "tenant_id"),
        pa.field("conversation_id", pa.string()),
        *required("kind", "text"),
        pa.field("time", TS),
        pa.field("valid_from", TS),
        pa.field("valid_to", TS),
        pa.field("session_id", pa.string()),
        pa.field("belief", pa.float32()),
        pa.field("importance", pa.float32()),
        pa.field("source", pa.string()),
        pa.field("prompt_version", pa.string()),
        pa.field("provenance", pa.list_(pa.string())),  # turn node ids
        pa.field("attributes", pa.string()),             # JSON object as a string
        pa.field("embedding", pa.list_(pa.float32(), dim)),
    ])


NODES = nodes_schema()
# nodes before the embedding stage
NODES_NO_EMBEDDING = pa.schema([f for f in NODES if f.name != "embedding"])

EDGES = pa.schema([
    *required("tenant_id", "src", "dst", "kind"),
    pa.field("weight", pa.float32()),
    pa.field("relation", pa.string()),
    pa.field("provenance", pa.list_(pa.string())),  # turn node ids
])

# --- intermediate tables of the staged build (session-local outputs kept per session) ---
# Every row carries ``session_key``: the content hash of its session and the build key
# (memlib/compose/sessions.py), so a nightly run reuses the rows of an unchanged session.

# a fact before its concepts are canonicalized over the tenant (facts stage, session-local)
FACT_DRAFTS = pa.schema([
    *required("session_key", "node_id", "tenant_id", "conversation_id", "session_id", "turn_node_id", "turn_id"),
    pa.field("speaker", pa.string()),
    pa.field("text", pa.string(), nullable=False),
    pa.field("time", TS),
    pa.field("dates", pa.string()),                      # JSON list of date mentions
    pa.field("dated_by_mention", pa.bool_()),
    pa.field("entities", pa.list_(pa.string())),
    pa.field("labels", pa.list_(pa.string())),           # concept labels, not yet canonical
])

# per session, with the default embedder: the vector of each drafted fact's own text (each text
# encoded alone, as a turn's), which the tenant's node-vector step sums with the fact's pooled
# vector (memlib.compose.vectors.BLEND_KINDS)
FACT_VECTORS = pa.schema([
    pa.field("node_id", pa.string(), nullable=False),
    pa.field("vector", pa.list_(pa.float32()), nullable=False),
])

# an entity mention, in turn order, before entities are canonicalized over the tenant
# per session: its keyphrase candidates scored by RAKE with its own speakers' names banned
# (memlib/text/clues.py clue_drafts); the tenant's clue step ranks them by IDF over its sessions
CLUE_DRAFTS = pa.schema([
    *required("tenant_id", "conversation_id", "session_id"),
    pa.field("session_time", TS),
    pa.field("turn_ids", pa.list_(pa.string())),          # turn node ids, in order
    pa.field("speakers", pa.list_(pa.string())),
    pa.field("keys", pa.list_(pa.string())),              # candidate keys, their first surface form and score
    pa.field("surfaces", pa.list_(pa.string())),
    pa.field("scores", pa.list_(pa.float64())),
    pa.field("words", pa.list_(pa.string())),             # the candidates' lowercase words
    pa.field("candidates", pa.list_(pa.list_(pa.string()))),  # to score again under a wider ban
])

ENTITY_MENTIONS = pa.schema([
    *required("session_key", "tenant_id", "name", "label"),
    pa.field("turn_node_id", pa.string()),               # set: a MENTIONS edge turn -> entity
    pa.field("turn_id", pa.string()),
    pa.field("sentence", pa.string()),                   # the citing sentence (entity description)
])

# a triplet whose subject / object are resolved to entities over the tenant
TRIPLET_DRAFTS = pa.schema([
    *required("session_key", "node_id", "tenant_id", "conversation_id", "session_id"),
    pa.field("time", TS),
    *required("text", "subject", "relation", "object", "turn_node_id", "turn_id"),
    pa.field("speaker", pa.string()),
    pa.field("subject_entity", pa.string()),             # name to resolve to an entity, if eligible
    pa.field("object_entity", pa.string()),
])


def turn_vectors_schema(dim: int = DEFAULT_EMBED_DIM) -> pa.Schema:
    """Output of the embed operator, one row per turn: the turn's passage vector and the
    content-token ids and float16 token vectors of ``auto``'s token encoder."""
    return pa.schema([
        *required("session_key", "tenant_id", "node_id"),
        pa.field("vector", pa.list_(pa.float32(), dim)),
        pa.field("token_ids", pa.list_(pa.int32())),
        pa.field("token_vectors", pa.binary()),          # (len(token_ids), 384) float16, C order
        # the token vectors quantized as auto's int8 kernel reads them (memlib/retrieve/int8_maxsim.py):
        # (len(token_ids), 384) int8 rows, C order, and their float32 scales; null in blocks kept
        # before they were written (the kernel then quantizes at a tenant's first query)
        pa.field("token_int8", pa.binary()),
        pa.field("token_scales", pa.binary()),
    ])


QUARANTINE = pa.schema([
    pa.field("tenant_id", pa.string()),
    pa.field("conversation_id", pa.string()),
    pa.field("record_id", pa.string()),
    pa.field("source", pa.string()),     # file path
    pa.field("location", pa.string()),   # e.g. "line 17" or "sample[2].session_3[4]"
    *required("reason_code", "reason"),
    pa.field("raw", pa.string()),        # the offending record, truncated
])

QUESTIONS = pa.schema([
    *required("tenant_id", "question_id", "question"),
    pa.field("answer", pa.string()),
    pa.field("category", pa.string()),
    pa.field("evidence", pa.list_(pa.string())),          # source turn ids (e.g. D1:3)
    pa.field("evidence_sessions", pa.list_(pa.string())),  # session ids
    pa.field("question_time", TS),
])

LLM_CALLS = pa.schema([
    pa.field("call_id", pa.string(), nullable=False),
    pa.field("tenant_id", pa.string()),
    pa.field("task", pa.string(), nullable=False),
    pa.field("unit_id", pa.string()),
    pa.field("model", pa.string()),
    pa.field("prompt_hash", pa.string()),
    pa.field("cache_key", pa.string()),
    pa.field("status", pa.string(), nullable=False),  # ok | cached | error
    pa.field("prompt_tokens", pa.int64()),
    pa.field("completion_tokens", pa.int64()),
    pa.field("latency_ms", pa.float64()),
    pa.field("attempts", pa.int32()),
    pa.field("error", pa.string()),
    pa.field("created_at", TS),
])

# Per derived node of a tenant, the clues as they are before the link step merges them: the
# WordPiece ids of its text that none of its provenance turns has, whose vectors it pools from
# every turn of the tenant instead, how many positions of its text each has, and (when it has
# such ids, and for every clue) the sum over its other positions, float32 bytes
# (memlib.compose.span_pool.Fallback). A nightly run that only appends turns reads them to tell
# which published node vectors still hold without tokenizing every node, and to give a node
# whose fallback ids the added turns hold, or an unchanged clue, its vector without reading its
# turns' token rows (memlib.compose.reuse).
NODE_FALLBACKS = pa.schema([
    *required("tenant_id", "node_id"),
    pa.field("ids", pa.list_(pa.int32())),
    pa.field("counts", pa.list_(pa.int32())),
    pa.field("local", pa.binary()),  # float32 bytes: a binary column reads ~10x faster than a list one
    pa.field("inputs", pa.string()),  # clues only: a hash of the clue's text and provenance
])

# Per WordPiece id of a tenant's turns: how many token rows carry it and their exact sum, in
# units of 2^-24 (memlib.compose.span_pool.IdSums): the means of fallback ids, which a nightly run
# updates by adding its added turns' rows.
TOKEN_SUMS = pa.schema([
    pa.field("tenant_id", pa.string(), nullable=False),
    pa.field("id", pa.int32(), nullable=False),
    pa.field("count", pa.int64(), nullable=False),
    pa.field("sum", pa.binary()),  # int64 bytes, one per dimension
])

# Per node: its global importance (memlib.graph.importance), apart from the Lance ``nodes`` rows.
# Adding a session moves the PageRank and percentile ranks behind every node's importance, so a
# row holding it would change for every node of a touched tenant; kept here, the Lance rows of
# unchanged nodes stay as published and a nightly run rewrites only the rows that changed
# (memlib.io.lance_delta). Stores written before it hold importance in the Lance rows.
NODE_IMPORTANCE = pa.schema([
    *required("tenant_id", "node_id"),
    pa.field("importance", pa.float32()),
])

# Per tenant: ``auto``'s token matrix as a reference to the token vectors its sessions kept
# (memlib.retrieve.matrix_cache): the content key of the turns and texts the matrix encodes, in
# order, and the session build key and session keys whose kept vectors make it up.
MATRIX_REFS = pa.schema([
    *required("tenant_id", "content_key", "session_build_key"),
    pa.field("sessions", pa.list_(pa.string())),
])

TABLES: dict[str, pa.Schema] = {
    "turns": TURNS,
    "segments": SEGMENTS,
    "nodes": NODES,
    "edges": EDGES,
    "quarantine": QUARANTINE,
    "questions": QUESTIONS,
    "llm_calls": LLM_CALLS,
    "node_fallbacks": NODE_FALLBACKS,
    "token_sums": TOKEN_SUMS,
    "matrix_refs": MATRIX_REFS,
    "node_importance": NODE_IMPORTANCE,
}


class SchemaError(ValueError):
    pass


def empty(schema: pa.Schema) -> pa.Table:
    return schema.empty_table()


def conform(table: pa.Table, schema: pa.Schema, *, name: str = "table") -> pa.Table:
    """Select, order and cast ``table``'s columns to ``schema``.

    Missing nullable columns are filled with nulls; a missing non-nullable column or a
    null in a non-nullable column raises :class:`SchemaError` naming the table and column.
    """
    if table.schema.equals(schema, check_metadata=True):
        _check_required(table, schema, name)
        return table
    cols = []
    n = table.num_rows
    names = set(table.schema.names)
    for field in schema:
        if field.name in names:
            col = table.column(field.name)
            if not col.type.equals(field.type):
                try:
                    col = col.cast(field.type)
                except pa.ArrowException as exc:  # invalid values or an unsupported cast
                    raise SchemaError(f"{name}.{field.name}: cannot cast {col.type} to {field.type}: {exc}") from exc
            if not field.nullable and col.null_count:
                raise SchemaError(f"{name}.{field.name}: {col.null_count} null value(s) in a required column")
        elif field.nullable:
            col = pa.nulls(n, field.type)
        else:
            raise SchemaError(f"{name}: required column {field.name!r} is missing")
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=schema)


def _check_required(table: pa.Table, schema: pa.Schema, name: str) -> None:
    for i, field in enumerate(schema):
        if not field.nullable and table.column(i).null_count:
            raise SchemaError(f"{name}.{field.name}: {table.column(i).null_count} null value(s) in a required column")


def check(table: pa.Table, schema: pa.Schema, *, name: str = "table") -> None:
    """Raise :class:`SchemaError` unless ``table`` has exactly ``schema``'s names and types."""
    got = [(f.name, f.type) for f in table.schema]
    want = [(f.name, f.type) for f in schema]
    if got != want:
        raise SchemaError(f"{name}: schema mismatch\n got:  {got}\n want: {want}")
