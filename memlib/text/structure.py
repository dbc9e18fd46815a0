"""Structural nodes and edges of a conversation: turns, sessions, NEXT / IN_SESSION.

Pure functions over Arrow tables (``TURNS`` in, ``NODES_NO_EMBEDDING`` / ``EDGES`` out).
Several tenants and sessions may be passed at once; every grouping key includes
tenant, conversation and session so nothing is mixed across those boundaries.
"""
from __future__ import annotations

import json

import polars as pl
import pyarrow as pa

from memlib import ids, schema
from memlib.schema import EdgeKind, NodeKind, Source

SESSION_KEYS = ["tenant_id", "conversation_id", "session_id"]
CAPTION_KEYS = ("blip_caption", "caption", "image_caption")


def caption_of(extras_json: str | None) -> str | None:
    """The image caption stored in a turn's ``extras`` JSON, if any."""
    if not extras_json:
        return None
    try:
        extras = json.loads(extras_json)
    except (TypeError, ValueError):
        return None
    if not isinstance(extras, dict):
        return None
    for key in CAPTION_KEYS:
        value = extras.get(key)
        if isinstance(value, list):
            value = "; ".join(str(v) for v in value if v)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def index_text(speaker: str | None, text: str, extras_json: str | None, with_caption: bool = True) -> str:
    """``"Speaker: text [image: caption]"``: the text indexed and embedded for a turn node."""
    body = (text or "").strip()
    out = f"{speaker}: {body}" if speaker else body
    caption = caption_of(extras_json) if with_caption else None
    return f"{out} [image: {caption}]" if caption else out


def index_texts(turns: pa.Table, with_caption: bool = True) -> pa.Array:
    """:func:`index_text` for every row of a TURNS table (captions parsed only where extras exist)."""
    df = pl.from_arrow(turns.select(["speaker", "text", "extras"]))
    captions = [caption_of(e) if with_caption else None for e in df["extras"].to_list()]
    df = df.with_columns(pl.Series("caption", captions, dtype=pl.String))
    out = df.select(
        pl.when(pl.col("speaker").fill_null("").str.len_chars() > 0)
        .then(pl.col("speaker") + pl.lit(": ") + pl.col("text").str.strip_chars())
        .otherwise(pl.col("text").str.strip_chars())
        .alias("t"),
        pl.col("caption"),
    ).select(
        pl.when(pl.col("caption").is_not_null())
        .then(pl.col("t") + pl.lit(" [image: ") + pl.col("caption") + pl.lit("]"))
        .otherwise(pl.col("t"))
        .alias("index_text")
    )
    return out.to_arrow().column("index_text").combine_chunks()


TURN_ORDER = ["tenant_id", "conversation_id", "session_index", "session_id", "turn_index"]


def sort_turns(df: pl.DataFrame) -> pl.DataFrame:
    """Turn rows ordered by tenant, conversation, session order and turn order."""
    return df.sort(TURN_ORDER, maintain_order=True)


def sorted_turns(turns: pa.Table) -> pl.DataFrame:
    """A TURNS table as polars, in :data:`TURN_ORDER`."""
    return sort_turns(pl.from_arrow(turns))


def turn_nodes(turns: pa.Table, with_caption: bool = True) -> pa.Table:
    """One ``turn`` node per turn row; id = ``turns.node_id``, text = :func:`index_text`."""
    df = pl.from_arrow(turns).with_columns(
        pl.Series("text_idx", index_texts(turns, with_caption)))
    out = df.select(
        pl.col("node_id"),
        pl.col("tenant_id"),
        pl.col("conversation_id"),
        pl.lit(NodeKind.TURN.value).alias("kind"),
        pl.col("text_idx").alias("text"),
        pl.col("session_time").alias("time"),
        pl.col("session_time").alias("valid_from"),
        pl.col("session_id"),
        pl.lit(1.0, dtype=pl.Float32).alias("belief"),
        pl.lit(Source.INPUT.value).alias("source"),
        pl.concat_list(pl.col("node_id")).alias("provenance"),
        pl.struct(
            pl.col("turn_id"), pl.col("speaker"), pl.col("role"),
            pl.col("session_index"), pl.col("turn_index"),
        ).struct.json_encode().alias("attributes"),
    )
    return schema.conform(out.to_arrow(), schema.NODES_NO_EMBEDDING, name="turn_nodes")


def _session_ids(df: pl.DataFrame) -> pl.DataFrame:
    """Unique sessions of ``df`` with their ``session_node_id``."""
    sessions = df.select(SESSION_KEYS).unique(maintain_order=True)
    node_ids = [ids.session_node_id(t, c, s) for t, c, s in sessions.iter_rows()]
    return sessions.with_columns(pl.Series("session_node_id", node_ids, dtype=pl.String))


def session_nodes(turns: pa.Table, segments: pa.Table | None = None, fallback_turns: int = 3) -> pa.Table:
    """One ``session`` node per session; text = its segment summaries in order.

    Where a session has no summary (no segments, or empty summaries) the text falls back
    to its first ``fallback_turns`` turn index texts, so every session stays searchable.
    """
    df = sort_turns(pl.from_arrow(turns).with_columns(
        pl.Series("text_idx", index_texts(turns, with_caption=True))))
    per_session = df.group_by(SESSION_KEYS, maintain_order=True).agg(
        pl.col("session_index").first(),
        pl.col("session_time").first(),
        pl.col("node_id").alias("provenance"),
        pl.col("text_idx").head(fallback_turns).str.join(" ").alias("fallback"),
        pl.col("speaker").drop_nulls().unique(maintain_order=True).alias("speakers"),
        pl.len().alias("n_turns"),
    )
    summaries = _session_summaries(segments)
    if summaries is not None:
        per_session = per_session.join(summaries, on=SESSION_KEYS, how="left")
    else:
        per_session = per_session.with_columns(pl.lit(None, dtype=pl.String).alias("summary"))
    per_session = per_session.join(_session_ids(per_session), on=SESSION_KEYS, how="left")
    out = per_session.select(
        pl.col("session_node_id").alias("node_id"),
        pl.col("tenant_id"),
        pl.col("conversation_id"),
        pl.lit(NodeKind.SESSION.value).alias("kind"),
        pl.when(pl.col("summary").fill_null("").str.len_chars() > 0)
        .then(pl.col("summary")).otherwise(pl.col("fallback")).alias("text"),
        pl.col("session_time").alias("time"),
        pl.col("session_time").alias("valid_from"),
        pl.col("session_id"),
        pl.lit(1.0, dtype=pl.Float32).alias("belief"),
        pl.lit(Source.HEURISTIC.value).alias("source"),
        pl.col("provenance"),
        pl.struct(pl.col("session_index"), pl.col("n_turns"), pl.col("speakers"))
        .struct.json_encode().alias("attributes"),
    )
    return schema.conform(out.to_arrow(), schema.NODES_NO_EMBEDDING, name="session_nodes")


def _session_summaries(segments: pa.Table | None) -> pl.DataFrame | None:
    if segments is None or segments.num_rows == 0:
        return None
    seg = pl.from_arrow(segments.select(SESSION_KEYS + ["segment_index", "summary"]))
    return (seg.filter(pl.col("summary").fill_null("").str.len_chars() > 0)
            .sort(SESSION_KEYS + ["segment_index"])
            .group_by(SESSION_KEYS, maintain_order=True)
            .agg(pl.col("summary").str.join(" ")))


def structure_edges(turns: pa.Table) -> pa.Table:
    """NEXT edges turn -> following turn (per session, turn_index order) and IN_SESSION turn -> session."""
    df = sorted_turns(turns).select(SESSION_KEYS + ["node_id"])
    nxt = df.with_columns(pl.col("node_id").shift(-1).over(SESSION_KEYS).alias("dst")).filter(
        pl.col("dst").is_not_null()).select(
        pl.col("tenant_id"), pl.col("node_id").alias("src"), pl.col("dst"),
        pl.lit(EdgeKind.NEXT.value).alias("kind"),
        pl.concat_list(pl.col("node_id"), pl.col("dst")).alias("provenance"),
    )
    ins = df.join(_session_ids(df), on=SESSION_KEYS, how="left").select(
        pl.col("tenant_id"), pl.col("node_id").alias("src"), pl.col("session_node_id").alias("dst"),
        pl.lit(EdgeKind.IN_SESSION.value).alias("kind"),
        pl.concat_list(pl.col("node_id")).alias("provenance"),
    )
    out = pl.concat([nxt, ins]).with_columns(pl.lit(1.0, dtype=pl.Float32).alias("weight"))
    return schema.conform(out.to_arrow(), schema.EDGES, name="structure_edges")
