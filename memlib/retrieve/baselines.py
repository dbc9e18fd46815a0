"""Baseline strategies over turns: ``bm25`` (Lance full-text search), ``dense`` (vector
search) and ``hybrid`` (reciprocal rank fusion of both). They are the floor every graph
strategy must beat.

Parameters (``cfg.retrieve.params[<name>]`` or per call):

* ``bm25``:   ``kinds`` node kinds searched (default ``["turn"]``).
* ``dense``:  ``kinds`` (default ``["turn"]``); ``vector_backend`` ``matrix`` (exact kNN on the
  in-memory tenant matrix, default) or ``lance`` (Lance vector search, uses the ANN index
  when the store built one).
* ``hybrid``: ``kinds``, ``vector_backend``; ``pool`` candidates from each ranker (100);
  ``rrf_k`` fusion constant (5, chosen by cross-validation: :data:`HYBRID_RRF_K`);
  ``bm25_weight`` / ``dense_weight`` (1.0 each).
"""
from __future__ import annotations

from enum import Enum
from typing import Any

from memlib.retrieve import kernels
from memlib.retrieve.base import RetrievedNode, StrategyBase
from memlib.retrieve.registry import register
from memlib.retrieve.tenant import TenantIndex
from memlib.schema import NodeKind


class VectorBackend(str, Enum):
    MATRIX = "matrix"
    LANCE = "lance"


TURN_KINDS = [NodeKind.TURN.value]

# hybrid's fusion constant, chosen by `memlib tune` over locomo_dev3 and longmemeval_s_dev24 from
# 60, 30, 20, 10, 5, 2, 1 (the grid's best on all questions; docs/decisions/0017-hybrid-rrf.md).
# Cormack et al.'s 60 flattens the ranks of a short list: a turn ranked 1st by one
# ranker and absent from the other scored below one ranked 20th by both.
HYBRID_RRF_K = 5


def vector_ranking(index: TenantIndex, query: str, k: int, kinds: list[str], backend: str) -> kernels.Ranking:
    qvec = index.embed_query(query)
    if VectorBackend(backend) is VectorBackend.LANCE:
        return kernels.lance_knn(index, qvec, k, kinds)
    return kernels.knn(index, qvec, k, kinds)


@register("bm25")
class BM25(StrategyBase):
    """Lance native full-text search (BM25) over turn text."""

    defaults = {"kinds": TURN_KINDS}
    uses_query_vector = False

    def search(self, tenant: TenantIndex, query: str, k: int, **params: Any) -> list[RetrievedNode]:
        p = self.call_params(params)
        return kernels.make_nodes(tenant, kernels.lance_fts(tenant, query, k, p["kinds"]), score_name="bm25")


@register("dense")
class Dense(StrategyBase):
    """Cosine vector search over turn embeddings."""

    defaults = {"kinds": TURN_KINDS, "vector_backend": VectorBackend.MATRIX.value}

    def search(self, tenant: TenantIndex, query: str, k: int, **params: Any) -> list[RetrievedNode]:
        p = self.call_params(params)
        ranking = vector_ranking(tenant, query, k, p["kinds"], p["vector_backend"])
        return kernels.make_nodes(tenant, ranking, score_name="cosine")


@register("hybrid")
class Hybrid(StrategyBase):
    """Reciprocal rank fusion (k = :data:`HYBRID_RRF_K`) of the top-``pool`` BM25 and dense turn rankings."""

    defaults = {"kinds": TURN_KINDS, "vector_backend": VectorBackend.MATRIX.value, "pool": 100,
                "rrf_k": HYBRID_RRF_K, "bm25_weight": 1.0, "dense_weight": 1.0}

    def search(self, tenant: TenantIndex, query: str, k: int, **params: Any) -> list[RetrievedNode]:
        p = self.call_params(params)
        pool = max(int(p["pool"]), k)
        lex = kernels.lance_fts(tenant, query, pool, p["kinds"])
        vec = vector_ranking(tenant, query, pool, p["kinds"], p["vector_backend"])
        fused = kernels.rrf([lex, vec], k=int(p["rrf_k"]),
                            weights=[float(p["bm25_weight"]), float(p["dense_weight"])])[:k]
        lex_rank = {nid: r for r, (nid, _) in enumerate(lex, start=1)}
        vec_rank = {nid: r for r, (nid, _) in enumerate(vec, start=1)}
        lex_score, vec_score = dict(lex), dict(vec)
        signals = {nid: {"bm25": lex_score.get(nid, 0.0), "cosine": vec_score.get(nid, 0.0),
                         "bm25_rank": float(lex_rank.get(nid, 0)), "dense_rank": float(vec_rank.get(nid, 0))}
                   for nid, _ in fused}
        return kernels.make_nodes(tenant, fused, signals, score_name="rrf")
