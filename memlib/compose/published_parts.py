"""What a tenant's published part files give a run that reuses its published build
(:class:`memlib.compose.reuse.PreviousTenant` is these and its Lance rows). They are read without
lancedb: a run in the driver reads them while lancedb is imported (:mod:`pipelines.prefetch`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.compose.span_pool import Fallback, IdSums
from memlib.compose.vectors import binary_views, list_views

EDGE_COLUMNS = ["src", "dst", "kind", "weight"]  # what is read of its edges


@dataclass
class PublishedParts:
    """A tenant's SIMILAR edges, its nodes' fallbacks (node id -> :class:`Fallback`,
    ``schema.NODE_FALLBACKS``), its per-id sums (``schema.TOKEN_SUMS``) and its clues' inputs (clue
    id before the merge -> :func:`memlib.compose.reuse.clue_key`), as published."""
    similar: pa.Table  # its SIMILAR edges: src, dst, weight (between turns, and others)
    fallbacks: dict[str, Fallback] | None
    sums: IdSums | None
    clue_inputs: dict[str, str]

    @classmethod
    def of(cls, edges: pa.Table, fallbacks: pa.Table | None = None, sums: pa.Table | None = None) -> PublishedParts:
        similar = edges.filter(pc.equal(edges.column("kind"), schema.EdgeKind.SIMILAR.value))
        known, clues = None, {}
        if fallbacks is not None and fallbacks.num_rows:
            if "inputs" in fallbacks.column_names:
                hashed = fallbacks.filter(pc.is_valid(fallbacks.column("inputs")))
                clues = dict(zip(hashed.column("node_id").to_pylist(), hashed.column("inputs").to_pylist()))
            local = binary_views(fallbacks.column("local"), np.float32)
            known = {n: Fallback(i, c, v) for n, i, c, v in zip(fallbacks.column("node_id").to_pylist(),
                                                                list_views(fallbacks.column("ids")),
                                                                list_views(fallbacks.column("counts")), local)}
        kept = IdSums.from_table(sums) if sums is not None and sums.num_rows else None
        return cls(similar.select(["src", "dst", "weight"]), known, kept, clues)


def reusable(manifest: dict | None, tenant: str | None, session_key: str) -> bool:
    """Whether ``tenant``'s build in the published ``manifest`` was made under ``session_key`` (the
    same code format, config and encoder as this run), so a run can reuse it."""
    return bool(manifest) and manifest.get("session_build_key") == session_key and tenant in manifest.get("tenants", {})


def read_parts(reader: Any, tenant: str) -> PublishedParts:
    """``tenant``'s :class:`PublishedParts` in the version of ``reader`` (a :class:`~memlib.io.store.StoreReader`)."""
    return PublishedParts.of(reader.table("edges", tenant, EDGE_COLUMNS), reader.table("node_fallbacks", tenant),
                             reader.table("token_sums", tenant))
