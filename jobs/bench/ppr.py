"""PPR kernel benchmark on synthetic memory graphs (``memlib bench ppr``).

Per size: one GAAMA-weighted transition (cached, as at query time) and ``queries`` random
seed sets (10 turns, weights uniform in (0.5, 1]). Full-graph PPR is timed with the scipy
power iteration, graph-tool's ``pagerank`` (pers + weight, on a graph carrying the same
transition probabilities) and networkx ``pagerank`` (sizes ≤ ``NETWORKX_MAX``); all at tol
1e-6, damping 0.6; ``max_abs_diff_*`` compare their score vectors. Query subgraphs: the
seeds' depth-2 neighbourhood capped at 5 000 nodes; extraction and PPR (transition build +
iteration, since every query has a new subgraph) are timed separately.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from memlib.config import GraphConfig
from memlib.graph.ppr import (
    Transition,
    gt_personalized_pagerank,
    gt_transition_graph,
    personalized_pagerank,
    teleport_vector,
)
from memlib.graph.subgraph import subgraph
from memlib.graph.synthetic import synthetic_memory_graph
from memlib.graph.variants import gaama_ppr_scores, gaama_transition

NETWORKX_MAX = 100_000
SEEDS_PER_QUERY = 10
SLOW_KERNEL_QUERIES = 3  # graph-tool / networkx runs per size above 10k nodes


def _ms(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1e3, out


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 3) if values else float("nan")


def _networkx_ppr(tr: Transition, teleport: np.ndarray, damping: float, tol: float) -> Callable[[], np.ndarray]:
    import networkx as nx

    p = tr.pt.tocoo()
    p.sum_duplicates()  # parallel traversals must add up: a DiGraph would overwrite them
    g = nx.DiGraph()
    g.add_nodes_from(range(tr.n))
    g.add_weighted_edges_from(zip(p.col.tolist(), p.row.tolist(), p.data.tolist()))
    pers = {int(i): float(teleport[i]) for i in np.flatnonzero(teleport)}

    def run() -> np.ndarray:
        # networkx stops at an L1 change below n·tol: scale so the criterion matches ours
        res = nx.pagerank(g, alpha=damping, personalization=pers, tol=tol / tr.n, max_iter=200, weight="weight")
        return np.fromiter((res[i] for i in range(tr.n)), dtype=np.float64, count=tr.n)
    return run


def _full_graph(graph, cfg: GraphConfig, seed_sets: list[np.ndarray], slow_queries: int) -> dict[str, Any]:
    build_ms, tr = _ms(lambda: gaama_transition(graph, cfg))
    gt_ms_build, gtg = _ms(lambda: gt_transition_graph(tr))
    out: dict[str, list[float]] = {"scipy": [], "graph_tool": [], "networkx": []}
    diffs_gt, diffs_nx, iters = [], [], []
    for qi, seeds in enumerate(seed_sets):
        v = teleport_vector(graph.num_nodes, seeds, np.linspace(1.0, 0.5, seeds.size))
        ms, res = _ms(lambda v=v: personalized_pagerank(tr.pt, v, cfg.damping, cfg.tol, cfg.max_iter))
        out["scipy"].append(ms)
        iters.append(res.iterations)
        if qi < slow_queries:
            ms, ref = _ms(lambda v=v: gt_personalized_pagerank(gtg, v, cfg.damping, cfg.tol, cfg.max_iter))
            out["graph_tool"].append(ms)
            diffs_gt.append(float(np.abs(ref.scores - res.scores).max()))
            if graph.num_nodes <= NETWORKX_MAX:
                run = _networkx_ppr(tr, v, cfg.damping, cfg.tol)
                ms, nxs = _ms(run)
                out["networkx"].append(ms)
                diffs_nx.append(float(np.abs(nxs - res.scores).max()))
    row = {"transition_build_ms": round(build_ms, 2), "gt_graph_build_ms": round(gt_ms_build, 2),
           "scipy_ms_p50": _pct(out["scipy"], 50), "scipy_iterations_p50": _pct(iters, 50),
           "graph_tool_ms_p50": _pct(out["graph_tool"], 50),
           "max_abs_diff_graph_tool_vs_scipy": max(diffs_gt, default=None)}
    if out["networkx"]:
        row["networkx_ms_p50"] = _pct(out["networkx"], 50)
        row["max_abs_diff_networkx_vs_scipy"] = max(diffs_nx)
    return row


def _subgraphs(graph, cfg: GraphConfig, seed_sets: list[np.ndarray], max_nodes: int) -> dict[str, Any]:
    ext, ppr, sizes = [], [], []
    for seeds in seed_sets:
        seed_ids = graph.ids[seeds].tolist()
        ms, sub = _ms(lambda seed_ids=seed_ids: subgraph(graph, seed_ids, cfg.expand_depth, max_nodes))
        ext.append(ms)
        sizes.append(sub.num_nodes)
        weights = dict(zip(seed_ids, np.linspace(1.0, 0.5, len(seed_ids)).tolist()))
        ms, _ = _ms(lambda sub=sub, weights=weights: gaama_ppr_scores(sub, weights, cfg))
        ppr.append(ms)
    return {"subgraph_nodes_p50": _pct(sizes, 50), "subgraph_nodes_max": int(max(sizes)),
            "subgraph_extract_ms_p50": _pct(ext, 50), "subgraph_extract_ms_p95": _pct(ext, 95),
            "subgraph_ppr_ms_p50": _pct(ppr, 50), "subgraph_ppr_ms_p95": _pct(ppr, 95)}


def bench_size(n: int, queries: int, cfg: GraphConfig | None = None, max_nodes: int = 5000,
               seed: int = 0) -> dict[str, Any]:
    cfg = cfg or GraphConfig()
    gen_ms, graph = _ms(lambda: synthetic_memory_graph(n, seed))
    rng = np.random.default_rng(seed + 1)
    turns = np.flatnonzero(graph.kind_mask("turn"))
    seed_sets = [rng.choice(turns, size=min(SEEDS_PER_QUERY, turns.size), replace=False) for _ in range(queries)]
    slow = queries if n <= 10_000 else min(queries, SLOW_KERNEL_QUERIES)
    row: dict[str, Any] = {"nodes": graph.num_nodes, "edges": graph.num_edges,
                           "max_degree": int(graph.degree.max()), "generate_ms": round(gen_ms, 1),
                           "queries": queries, "slow_kernel_queries": slow}
    row.update(_full_graph(graph, cfg, seed_sets, slow))
    row.update(_subgraphs(graph, cfg, seed_sets, max_nodes))
    return row


def run_benchmark(sizes: list[int], queries: int, cfg: GraphConfig | None = None,
                  gt_threads: int | None = None) -> dict[str, Any]:
    """``gt_threads`` pins graph-tool's OpenMP pool for this process (None: its default);
    on a shared, busy machine one thread avoids OpenMP spin-waiting against other work."""
    from memlib.graph.ppr import openmp_threads

    cfg = cfg or GraphConfig()
    threads = openmp_threads(gt_threads)
    return {"benchmark": "ppr", "damping": cfg.damping, "tol": cfg.tol, "expand_depth": cfg.expand_depth,
            "seeds_per_query": SEEDS_PER_QUERY, "graph_tool_threads": threads,
            "results": [bench_size(n, queries, cfg) for n in sizes]}
