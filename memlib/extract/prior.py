"""What a tenant-level extraction step reads from the tenant's published build to redo only what changed.

After a run that only added or removed whole turns of a published tenant, the heuristic facts and
triplets steps (:mod:`memlib.extract.facts_reuse`, :mod:`memlib.extract.triplets_reuse`) copy the
published row of every node whose inputs did not change and build the others as a full build
does (docs/decisions/0035-incremental-canonicalization.md). Their edges are made again from the
drafts in columnar form (:func:`merged_edges`, what :func:`memlib.extract.tables.edge_table` does
row by row).
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.extract.tables import EDGE_KEY

_SEP = "\x1f"


@dataclass(frozen=True)
class Prior:
    """A tenant's published build as the extraction steps reuse it.

    ``rows``: node kind -> its published rows of the kind (``NODES_NO_EMBEDDING``, no importance).
    ``dirty``: the sessions (``conversation_id \\x1f session_id``) whose drafts may
    differ from those the published build was made of: a session with an added, removed or
    changed turn (a draft is a function of its session's turns). ``dirty_turns``: the turn ids of
    those sessions, published and current; ``dirty_speakers``: their speakers. ``extends``: no
    published turn is in a dirty session (only new sessions were added), so every published
    draft is still there, unchanged."""
    rows: dict[str, pa.Table]
    dirty: frozenset[str]
    dirty_turns: frozenset[str]
    dirty_speakers: frozenset[str]
    extends: bool

    def of_kind(self, kind: schema.NodeKind) -> pa.Table:
        rows = self.rows.get(kind.value)
        return rows if rows is not None else schema.empty(schema.NODES_NO_EMBEDDING)

    def clean(self, conversation_ids: pa.ChunkedArray, session_ids: pa.ChunkedArray) -> np.ndarray:
        """Per row: whether its session is not dirty (its drafts are the published ones)."""
        keys = pc.binary_join_element_wise(conversation_ids, session_ids, _SEP)
        return ~pc.is_in(keys, pa.array(sorted(self.dirty), pa.string())).to_numpy(zero_copy_only=False)


def session_key(conversation_id: str | None, session_id: str | None) -> str:
    """A session as :attr:`Prior.dirty` names it."""
    return f"{conversation_id}{_SEP}{session_id}"


def positions(ids: pa.ChunkedArray | pa.Array, among: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Per id: its row in ``among`` (the first when repeated), -1 when absent."""
    at = pc.index_in(ids, value_set=among)
    return at.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)


def assemble(copied: pa.Table, copied_at: np.ndarray, built: pa.Table, built_at: np.ndarray) -> pa.Table:
    """Rows ``copied`` and ``built`` (each conformed to ``NODES_NO_EMBEDDING``) interleaved back
    into one table whose row ``copied_at[i]`` is ``copied``'s row i, and likewise for ``built``."""
    both = pa.concat_tables([schema.conform(copied, schema.NODES_NO_EMBEDDING, name="nodes"),
                             schema.conform(built, schema.NODES_NO_EMBEDDING, name="nodes")])
    where = np.concatenate([copied_at, built_at]).astype(np.int64)
    order = np.empty(where.size, dtype=np.int64)
    order[where] = np.arange(where.size, dtype=np.int64)
    return both.take(pa.array(order, pa.int64()))


def take_rows(table: pa.Table, rows: np.ndarray | Collection[int]) -> pa.Table:
    return table.take(pa.array(np.asarray(rows, dtype=np.int64), pa.int64()))


def merged_edges(parts: list[pl.DataFrame]) -> pa.Table:
    """Edge frames (tenant_id, src, dst, kind, relation, provenance) -> an ``EDGES`` table as
    :func:`memlib.extract.tables.edge_table` makes it from the same rows in the same order: one
    edge per (tenant, src, dst, kind, relation) in first-occurrence order, its provenance the
    sorted union of its rows' (nulls dropped), weight 1.0."""
    cols = [*EDGE_KEY, "provenance"]
    parts = [p.select(cols) for p in parts if p.height]
    if not parts:
        return schema.empty(schema.EDGES)
    df = pl.concat(parts, how="vertical_relaxed")
    turns = pl.col("provenance").list.explode(keep_nulls=False, empty_as_null=False)
    merged = (df.group_by(EDGE_KEY, maintain_order=True)
              .agg(turns.drop_nulls().unique().sort().alias("provenance"))
              .with_columns(pl.lit(1.0, dtype=pl.Float32).alias("weight")))
    return schema.conform(merged.to_arrow(), schema.EDGES, name="edges")


def edge_frame(tenant_id: str, ends: tuple[pl.Expr, pl.Expr], kind: schema.EdgeKind,
               provenance: pl.Expr, frame: pl.DataFrame, relation: pl.Expr | None = None) -> pl.DataFrame:
    """Edges of one ``kind`` from the rows of ``frame`` (``ends``: their source and destination):
    columns of :func:`merged_edges`."""
    src, dst = ends
    return frame.select(pl.lit(tenant_id).alias("tenant_id"), src.alias("src"), dst.alias("dst"),
                        pl.lit(kind.value).alias("kind"),
                        (relation if relation is not None else pl.lit(None, dtype=pl.String)).alias("relation"),
                        provenance.alias("provenance"))
