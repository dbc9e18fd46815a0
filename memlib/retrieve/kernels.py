"""Retrieval kernels every strategy composes: kNN (tenant matrix or Lance), Lance
full-text search (BM25), reciprocal rank fusion, provenance expansion to turns,
context packing, and :func:`run_search`, the one timed search path."""
from __future__ import annotations

import re
import time
from typing import Any, Iterable, Sequence

import numpy as np

from memlib.retrieve.base import RankedTurn, RetrievedNode, SearchResult, Strategy
from memlib.retrieve.event_time import format_event
from memlib.retrieve.tenant import TenantIndex

RRF_K = 60  # Cormack et al. reciprocal rank fusion constant
DEFAULT_WORD_BUDGET = 1000  # GAAMA context budget, in words
_FTS_TOKEN = re.compile(r"[A-Za-z0-9]+")
FTS_TIE_MARGIN = 16  # extra hits fetched so ties at the k-th score are ordered by id, not storage

Ranking = list[tuple[str, float]]  # (node id, score), best first


# -- first-stage rankers ----------------------------------------------------------------
def knn(index: TenantIndex, qvec: np.ndarray, k: int, kinds: Iterable[str] | None = None) -> Ranking:
    """Exact cosine kNN over the tenant's in-memory embedding matrix."""
    rows = index.rows_of_kind(kinds)
    if rows.size == 0 or k <= 0:
        return []
    q = np.asarray(qvec, dtype=np.float32)
    q = q / max(float(np.linalg.norm(q)), 1e-12)
    sims = index.embeddings[rows] @ q
    top = min(k, rows.size)
    part = np.argpartition(-sims, top - 1)[:top]
    order = part[np.argsort(-sims[part], kind="stable")]
    return [(index.node_ids[rows[i]], float(sims[i])) for i in order]


def lance_knn(index: TenantIndex, qvec: np.ndarray, k: int, kinds: Iterable[str] | None = None) -> Ranking:
    """Lance vector search (cosine), pre-filtered to the tenant and kinds; score = 1 - distance."""
    if k <= 0:
        return []
    res = (index.table.search(np.asarray(qvec, dtype=np.float32), vector_column_name="embedding")
           .distance_type("cosine").where(index.where(kinds), prefilter=True)
           .select(["node_id"]).limit(k).to_arrow())
    ids = res.column("node_id").to_pylist()
    dist = res.column("_distance").to_numpy(zero_copy_only=False)
    return [(i, float(1.0 - d)) for i, d in zip(ids, dist)]


def fts_query(text: str) -> str:
    """A Lance/tantivy-safe full-text query: alphanumeric tokens only (no operators,
    quotes, colons or parentheses that the query parser would interpret)."""
    return " ".join(_FTS_TOKEN.findall(text))


def lance_fts(index: TenantIndex, query: str, k: int, kinds: Iterable[str] | None = None) -> Ranking:
    """Lance native full-text search (BM25) over node text, pre-filtered to the tenant."""
    q = fts_query(query)
    if not q or k <= 0:
        return []
    kinds = None if kinds is None else [getattr(x, "value", x) for x in kinds]
    turn_tbl = index.turn_text_table if kinds == ["turn"] else None
    if turn_tbl is not None:  # turns only: the index whose corpus statistics are turns alone
        query = turn_tbl.search(q, query_type="fts").where(index.where(None), prefilter=True)
    else:
        query = index.table.search(q, query_type="fts").where(index.where(kinds), prefilter=True)
    res = query.select(["node_id", "_score"]).limit(k + FTS_TIE_MARGIN).to_arrow()
    ids = res.column("node_id").to_pylist()
    scores = res.column("_score").to_numpy(zero_copy_only=False)
    # equal scores in node id order: Lance returns ties in storage order, which differs between
    # a full build and a nightly run that added the same rows later
    ranked = sorted(zip(ids, scores.tolist()), key=lambda r: (-r[1], r[0]))
    return [(i, float(s)) for i, s in ranked[:k]]


def rrf(rankings: Sequence[Ranking], k: int = RRF_K, weights: Sequence[float] | None = None) -> Ranking:
    """Reciprocal rank fusion: score(d) = sum_i w_i / (k + rank_i(d)), ranks from 1.
    Ties keep the order of first appearance (stable)."""
    weights = list(weights) if weights is not None else [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError("rrf: one weight per ranking")
    scores: dict[str, float] = {}
    for ranking, w in zip(rankings, weights):
        for rank, (nid, _) in enumerate(ranking, start=1):
            scores[nid] = scores.get(nid, 0.0) + w / (k + rank)
    return sorted(scores.items(), key=lambda kv: -kv[1])


# -- results ----------------------------------------------------------------------------
def make_nodes(index: TenantIndex, ranking: Ranking, signals: dict[str, dict[str, float]] | None = None,
               score_name: str = "score") -> list[RetrievedNode]:
    """RetrievedNode objects (with provenance down to source turns) for a ranking.
    ``signals`` maps node id -> extra signals; the ranking score is recorded as ``score_name``."""
    out = []
    for nid, score in ranking:
        row = index.row_of.get(nid)
        if row is None:
            continue
        turn_nodes = index.turns_of(nid)
        infos = [index.turns[t] for t in turn_nodes]
        sig = {score_name: float(score)}
        if signals and nid in signals:
            sig.update(signals[nid])
        out.append(RetrievedNode(
            node_id=nid, kind=str(index.kinds[row]), text=index.texts[row], score=float(score), signals=sig,
            provenance=turn_nodes, turn_ids=[t.turn_id for t in infos],
            session_ids=list(dict.fromkeys(t.session_id for t in infos)), times=[t.time for t in infos]))
    return out


def expand_to_turns(index: TenantIndex, nodes: Sequence[RetrievedNode]) -> list[RankedTurn]:
    """Ranked nodes -> their source turns, de-duplicated in rank order."""
    seen: set[str] = set()
    out: list[RankedTurn] = []
    for node in nodes:
        for tnode in node.provenance or index.turns_of(node.node_id):
            if tnode in seen or tnode not in index.turns:
                continue
            seen.add(tnode)
            t = index.turns[tnode]
            out.append(RankedTurn(tnode, t.turn_id, t.session_id, t.time, t.text, node.node_id))
    return out


def _fmt_time(t: Any) -> str:
    return t.strftime("%Y-%m-%d %H:%M") if t is not None else "unknown time"


def pack_context(index: TenantIndex, nodes: Sequence[RetrievedNode], word_budget: int = DEFAULT_WORD_BUDGET) -> str:
    """Linearize ranked nodes with ids, kinds, source turns and times within a word budget.

    Each entry is ``[kind node_id | turns D1:3,D1:4 | sessions S1 | 2023-05-07 13:56] text``, with
    ``| event 2023-05-03`` before the bracket when ``auto`` found the turn tells of an event the
    build dated on another day (memlib/retrieve/event_time.py).
    Entries are added in rank order while the budget allows; the first entry is always
    included (truncated to the budget) so a non-empty result never packs to nothing."""
    lines: list[str] = []
    used = 0
    for node in nodes:
        head = f"[{node.kind} {node.node_id}"
        if node.turn_ids:
            head += " | turns " + ",".join(node.turn_ids[:8]) + ("…" if len(node.turn_ids) > 8 else "")
        if node.session_ids:
            head += " | sessions " + ",".join(node.session_ids[:4])
        times = [t for t in node.times if t is not None]
        head += f" | {_fmt_time(min(times)) if times else 'unknown time'}"
        event = format_event(node.signals, min(times) if times else None)  # a turn's own event date
        head += f" | {event}]" if event else "]"
        words = node.text.split()
        if used + len(words) > word_budget:
            if lines:
                break
            words = words[:word_budget]
        lines.append(f"{head} {' '.join(words)}")
        used += len(words)
    return "\n".join(lines)


def run_search(index: TenantIndex, strategy: Strategy, query: str, k: int,
               word_budget: int = DEFAULT_WORD_BUDGET, **params: Any) -> SearchResult:
    """Run ``strategy`` for one query: ranked nodes, provenance turns, packed context, latency."""
    t0 = time.perf_counter()
    nodes = strategy.search(index, query, k, **params)
    turns = expand_to_turns(index, nodes)
    latency = (time.perf_counter() - t0) * 1000.0
    context = pack_context(index, nodes, word_budget)
    return SearchResult(strategy=strategy.name, tenant=index.tenant, query=query, nodes=nodes,
                        turns=turns, latency_ms=latency, context=context)
