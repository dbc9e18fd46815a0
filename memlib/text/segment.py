"""TextTiling-style topic segmentation of sessions over precomputed turn embeddings.

For each gap between turns ``g-1`` and ``g`` of a session, the similarity is the cosine of
the mean vectors of the ``window`` turns before and after the gap. A gap's depth score is
how far its similarity lies below the nearest peaks reached by climbing left and right
(Hearst 1997). Gaps deeper than ``mean + depth_threshold * std`` of the session's depths
become boundaries; then too-short segments are merged through their shallower boundary and
too-long segments are split at their deepest admissible gap.

Turn vectors are computed once by the pipeline and passed in; nothing is embedded here.
"""
from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from memlib import ids, schema
from memlib.config import SegmentConfig
from memlib.schema import EdgeKind, NodeKind, Source
from memlib.text.structure import SESSION_KEYS, TURN_ORDER

_EPS = 1e-12


def gap_similarities(vectors: np.ndarray, window: int) -> np.ndarray:
    """Cosine between mean vectors of the ``window`` turns left and right of each gap (n-1 gaps)."""
    n = len(vectors)
    if n < 2:
        return np.zeros(0, dtype=np.float64)
    csum = np.vstack([np.zeros((1, vectors.shape[1])), np.cumsum(vectors, axis=0, dtype=np.float64)])
    g = np.arange(1, n)
    lo = np.maximum(g - window, 0)
    hi = np.minimum(g + window, n)
    left = (csum[g] - csum[lo]) / (g - lo)[:, None]
    right = (csum[hi] - csum[g]) / (hi - g)[:, None]
    num = np.einsum("ij,ij->i", left, right)
    den = np.linalg.norm(left, axis=1) * np.linalg.norm(right, axis=1)
    return num / np.maximum(den, _EPS)


def _climb(sims: np.ndarray, start: int, step: int) -> float:
    """Highest similarity reached from ``start`` while values keep rising in direction ``step``."""
    best, i = sims[start], start + step
    while 0 <= i < len(sims) and sims[i] >= best:
        best, i = sims[i], i + step
    return float(best)


def depth_scores(sims: np.ndarray) -> np.ndarray:
    """TextTiling depth of every gap: (left peak - s) + (right peak - s)."""
    return np.array([_climb(sims, i, -1) + _climb(sims, i, 1) - 2 * sims[i] for i in range(len(sims))])


def initial_boundaries(depths: np.ndarray, threshold: float) -> list[int]:
    """Gap indices (boundary before turn ``gap + 1``) with depth above mean + threshold*std."""
    if len(depths) == 0 or float(depths.std()) < _EPS:
        return []
    cut = depths.mean() + threshold * depths.std()
    return [int(i) for i in np.flatnonzero(depths > cut)]


def _lengths(cuts: list[int], n: int) -> list[int]:
    """Segment lengths for boundaries at turn positions ``cuts`` (sorted, in 1..n-1)."""
    edges = [0, *cuts, n]
    return [b - a for a, b in zip(edges, edges[1:])]


def merge_short(cuts: list[int], depths: np.ndarray, n: int, min_turns: int) -> list[int]:
    """Drop boundaries until every segment has >= ``min_turns`` turns (or one segment is left)."""
    cuts = sorted(cuts)
    while cuts:
        lens = _lengths(cuts, n)
        short = int(np.argmin(lens))
        if lens[short] >= min_turns:
            break
        # boundaries around segment k are cuts[k-1] (left) and cuts[k] (right)
        options = [j for j in (short - 1, short) if 0 <= j < len(cuts)]
        drop = min(options, key=lambda j: depths[cuts[j] - 1])
        cuts.pop(drop)
    return cuts


def split_long(cuts: list[int], depths: np.ndarray, n: int, min_turns: int, max_turns: int) -> list[int]:
    """Add boundaries at the deepest gap inside every segment longer than ``max_turns``."""
    cuts = sorted(cuts)
    while True:
        edges = [0, *cuts, n]
        long_seg = next(((a, b) for a, b in zip(edges, edges[1:]) if b - a > max_turns), None)
        if long_seg is None:
            return cuts
        a, b = long_seg
        positions = np.arange(a + 1, b)  # candidate cut before turn p
        ok = positions[(positions - a >= min_turns) & (b - positions >= min_turns)]
        if len(ok) == 0:
            ok = positions
        best = int(ok[np.argmax(depths[ok - 1])]) if depths.size else (a + b) // 2
        cuts = sorted([*cuts, best])


def session_cuts(vectors: np.ndarray, cfg: SegmentConfig) -> list[int]:
    """Boundary positions (segment starts, excluding 0) for one session's turn vectors."""
    n = len(vectors)
    sims = gap_similarities(vectors, max(1, cfg.window))
    depths = depth_scores(sims)
    cuts = [g + 1 for g in initial_boundaries(depths, cfg.depth_threshold)]
    cuts = merge_short(cuts, depths, n, max(1, cfg.min_turns))
    return split_long(cuts, depths, n, max(1, cfg.min_turns), max(cfg.max_turns, cfg.min_turns, 1))


def _check_vectors(turns: pa.Table, vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or len(vectors) != turns.num_rows:
        raise ValueError(f"turn_vectors must be (n_turns, dim) aligned with turns; got {vectors.shape} "
                         f"for {turns.num_rows} turns")
    return vectors


def segment_turns(turns: pa.Table, turn_vectors: np.ndarray, cfg: SegmentConfig | None = None) -> pa.Table:
    """Topic segments (SEGMENTS) of every session in ``turns``; ``turn_vectors`` aligned with rows."""
    cfg = cfg or SegmentConfig()
    vectors = _check_vectors(turns, turn_vectors)
    df = pl.from_arrow(turns).with_row_index("_row").sort(TURN_ORDER, maintain_order=True)
    labels = np.zeros(len(df), dtype=np.int32)
    rows = df["_row"].to_numpy()
    starts = _session_starts(df)
    for a, b in zip(starts, starts[1:]):
        cuts = session_cuts(vectors[rows[a:b]], cfg)
        labels[a:b] = np.searchsorted(np.asarray(cuts, dtype=np.int64), np.arange(b - a), side="right")
    df = df.with_columns(pl.Series("segment_index", labels, dtype=pl.Int32))
    segs = df.group_by(SESSION_KEYS + ["segment_index"], maintain_order=True).agg(
        pl.col("turn_id").first().alias("first_turn"),
        pl.col("node_id").alias("turn_ids"),
        pl.col("session_time").first(),
    )
    seg_ids = [ids.make_id(NodeKind.SEGMENT.value, t, c, s, f)
               for t, c, s, f in segs.select(SESSION_KEYS + ["first_turn"]).iter_rows()]
    segs = segs.with_columns(pl.Series("segment_id", seg_ids, dtype=pl.String))
    return schema.conform(segs.to_arrow(), schema.SEGMENTS, name="segments")


def _session_starts(df: pl.DataFrame) -> list[int]:
    """Row offsets where each session run starts in the sorted frame, plus the end."""
    if len(df) == 0:
        return [0]
    changed = pl.any_horizontal([pl.col(k).ne_missing(pl.col(k).shift(1)) for k in SESSION_KEYS])
    change = np.flatnonzero(df.select(changed.fill_null(True)).to_series().to_numpy())
    return [*change.tolist(), len(df)]


def segment_nodes_edges(segments: pa.Table, turns: pa.Table | None = None,
                        fallback_turns: int = 2) -> tuple[pa.Table, pa.Table]:
    """``segment`` nodes and IN_SEGMENT (turn->segment) + IN_SESSION (segment->session) edges.

    Node text is the segment summary; where it is empty and ``turns`` is given, the text of
    the first ``fallback_turns`` kept turns (or turns, if none were kept) is used instead.
    """
    seg = pl.from_arrow(segments)
    seg = seg.with_columns(_fallback_text(seg, turns, fallback_turns).alias("fallback"))
    session_ids = [ids.session_node_id(t, c, s) for t, c, s in seg.select(SESSION_KEYS).iter_rows()]
    seg = seg.with_columns(pl.Series("session_node_id", session_ids, dtype=pl.String))
    nodes = seg.select(
        pl.col("segment_id").alias("node_id"), pl.col("tenant_id"), pl.col("conversation_id"),
        pl.lit(NodeKind.SEGMENT.value).alias("kind"),
        pl.when(pl.col("summary").fill_null("").str.len_chars() > 0)
        .then(pl.col("summary")).otherwise(pl.col("fallback")).fill_null("").alias("text"),
        pl.col("session_time").alias("time"), pl.col("session_time").alias("valid_from"),
        pl.col("session_id"), pl.lit(1.0, dtype=pl.Float32).alias("belief"),
        pl.lit(Source.HEURISTIC.value).alias("source"),
        pl.col("turn_ids").alias("provenance"),
        pl.struct(pl.col("segment_index"), pl.col("turn_ids").list.len().alias("n_turns"),
                  pl.col("kept_turn_ids").list.len().fill_null(0).alias("n_kept"))
        .struct.json_encode().alias("attributes"),
    )
    in_seg = seg.select("tenant_id", "segment_id", "turn_ids").explode("turn_ids").select(
        pl.col("tenant_id"), pl.col("turn_ids").alias("src"), pl.col("segment_id").alias("dst"),
        pl.lit(EdgeKind.IN_SEGMENT.value).alias("kind"), pl.concat_list(pl.col("turn_ids")).alias("provenance"))
    in_ses = seg.select(
        pl.col("tenant_id"), pl.col("segment_id").alias("src"), pl.col("session_node_id").alias("dst"),
        pl.lit(EdgeKind.IN_SESSION.value).alias("kind"), pl.col("turn_ids").alias("provenance"))
    edges = pl.concat([in_seg, in_ses]).with_columns(pl.lit(1.0, dtype=pl.Float32).alias("weight"))
    return (schema.conform(nodes.to_arrow(), schema.NODES_NO_EMBEDDING, name="segment_nodes"),
            schema.conform(edges.to_arrow(), schema.EDGES, name="segment_edges"))


def _fallback_text(seg: pl.DataFrame, turns: pa.Table | None, k: int) -> pl.Expr:
    """Per segment: the texts of its first ``k`` kept turns (or turns) joined, or null."""
    if turns is None or len(seg) == 0:
        return pl.lit(None, dtype=pl.String)
    from memlib.text.structure import index_texts

    lookup = dict(zip(turns.column("node_id").to_pylist(), index_texts(turns).to_pylist()))
    texts = []
    for kept, all_ids in zip(seg["kept_turn_ids"].to_list(), seg["turn_ids"].to_list()):
        chosen = (kept or all_ids or [])[:k]
        texts.append(" ".join(lookup[t] for t in chosen if t in lookup) or None)
    return pl.Series("fallback", texts, dtype=pl.String)
