"""Forward-push PPR (memlib/retrieve/push.py) against the exact power iteration on the same transition:
the estimate differs from the exact vector by at most the residual it reports (L1), the residual
falls with the tolerance, a sink's mass returns to the seeds, and the work does not grow with the
graph around the seeds."""
from __future__ import annotations

import numpy as np
import pytest

from memlib.config import GraphConfig
from memlib.graph.build import build_graph
from memlib.graph.ppr import personalized_pagerank
from memlib.graph.synthetic import synthetic_memory_graph
from memlib.graph.variants import gaama_transition, seed_teleport
from memlib.retrieve.push import push_ppr


def _exact(g, tr, seeds, cfg):
    return personalized_pagerank(tr.pt, seed_teleport(g, seeds), cfg.damping, tol=1e-13, max_iter=5000).scores


@pytest.mark.parametrize("n", [2000, 20000])
def test_push_is_within_its_residual_of_the_exact_ppr(n):
    g = synthetic_memory_graph(n, seed=2)
    cfg = GraphConfig()
    tr = gaama_transition(g, cfg)
    rng = np.random.default_rng(5)
    verts = rng.choice(g.num_nodes, 10, replace=False)
    seeds = {g.ids[v]: float(w) for v, w in zip(verts, rng.random(10) + 0.1)}
    exact = _exact(g, tr, seeds, cfg)
    last = np.inf
    for eps in (1e-4, 1e-5, 1e-6, 1e-7):
        weights = np.fromiter(seeds.values(), float)
        res = push_ppr(g.adjacency().indptr, tr, g.vertices(seeds), weights, cfg.damping, eps)
        err = np.abs(exact - res.scores).sum()
        assert (res.scores <= exact + 1e-12).all()  # push only ever under-estimates
        assert err == pytest.approx(res.residual, abs=1e-9)  # ‖x - p‖₁ is exactly the mass left
        assert res.residual < last
        last = res.residual
        # every vertex left holds less than eps per unit of degree
        assert res.reads <= 1.0 / ((1 - cfg.damping) * eps) + np.diff(g.adjacency().indptr).max()
    assert last < 0.05
    # the mass the seeds' best vertices get: the same order as the exact one's at 1e-7
    top = np.argsort(-exact)[:20]
    assert np.abs(res.scores[top] - exact[top]).max() < 1e-3


def test_a_sinks_mass_returns_to_the_seeds(small_tables):
    g = build_graph(*small_tables)
    cfg = GraphConfig(hub_degree=3)
    tr = gaama_transition(g, cfg)
    assert tr.sink[g.vertex("clue:lonely")]
    seeds = {"turn:2": 1.0, "clue:lonely": 1.0}  # a seed that is a sink
    exact = _exact(g, tr, seeds, cfg)
    res = push_ppr(g.adjacency().indptr, tr, g.vertices(seeds), np.ones(2), cfg.damping, 1e-12)
    np.testing.assert_allclose(res.scores, exact, atol=1e-9)
    assert res.residual < 1e-8
    with pytest.raises(ValueError, match="seed"):
        push_ppr(g.adjacency().indptr, tr, np.array([-1]), np.ones(1), cfg.damping, 1e-6)


def test_the_work_depends_on_the_tolerance_not_the_graph():
    cfg = GraphConfig()
    reads = []
    for n in (10000, 100000):
        g = synthetic_memory_graph(n, seed=3)
        res = push_ppr(g.adjacency().indptr, gaama_transition(g, cfg), np.arange(5), np.ones(5), cfg.damping, 1e-5)
        reads.append(res.reads)
        assert np.count_nonzero(res.scores) < 0.2 * n  # the seeds' surroundings only
    assert max(reads) <= 1.0 / ((1 - cfg.damping) * 1e-5)
