from __future__ import annotations

import numpy as np

from memlib.graph.build import build_graph
from memlib.graph.importance import IMPORTANCE_SCHEMA, global_importance
from memlib.graph.synthetic import synthetic_memory_graph


def test_value_per_node(small_tables):
    nodes, edges = small_tables
    g = build_graph(nodes, edges)
    t = global_importance(g)
    assert t.schema == IMPORTANCE_SCHEMA
    assert t.column("node_id").to_pylist() == nodes.column("node_id").to_pylist()
    assert t.column("importance").null_count == 0
    imp = dict(zip(t.column("node_id").to_pylist(), t.column("importance").to_pylist()))
    assert imp["concept:hub"] > imp["turn:0"] > imp["clue:lonely"]
    assert all(0 < v <= 1 for v in imp.values())
    np.testing.assert_allclose(sum(t.column("pagerank").to_pylist()), 1.0, atol=1e-6)


def test_kcore_ignores_star_hubs():
    g = synthetic_memory_graph(3000, seed=4)
    t = global_importance(g)
    kcore = t.column("kcore").to_numpy()
    degree = t.column("degree").to_numpy()
    assert kcore.max() < degree.max()
    assert (kcore <= degree).all()


def test_percentile_rank_is_scipys_average_rank_over_n():
    from scipy.stats import rankdata

    from memlib.graph.importance import percentile_rank

    rng = np.random.default_rng(7)
    for n in (1, 2, 5, 100, 1000):
        for values in (rng.random(n), rng.integers(0, 4, n).astype(np.float64), np.zeros(n),
                       np.round(rng.random(n), 2), -rng.integers(0, 3, n).astype(np.int64)):
            np.testing.assert_array_equal(percentile_rank(values), rankdata(values, method="average") / n)
    assert percentile_rank(np.zeros(0)).size == 0
