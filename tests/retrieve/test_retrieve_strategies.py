"""Every strategy on a store built from the sample conversations: ranked results with
kind, text, score, signals and provenance to real turns."""
from __future__ import annotations

import pytest

from memlib.retrieve.kernels import run_search
from memlib.retrieve.registry import get_strategy, list_strategies

from tests.retrieve.conftest import retrieve_config

STRATEGIES = ["gaama", "memorai", "assomem", "magma", "personalai", "auto"]
pytestmark = pytest.mark.ray


def _question(cache, tenant):
    turns = cache.get(tenant).turns
    longest = max(turns.values(), key=lambda t: len(t.text))
    return longest, " ".join(longest.text.split()[:12])


def test_all_registered():
    assert set(STRATEGIES) <= set(list_strategies())


@pytest.mark.parametrize("name", STRATEGIES)
def test_strategy_provenance(cache, name):
    cfg = retrieve_config()
    strategy = get_strategy(name, cfg)
    for tenant in cache.tenants()[:2]:
        index = cache.get(tenant)
        target, query = _question(cache, tenant)
        res = run_search(index, strategy, query, 10)
        assert res.nodes, (name, tenant)
        for node in res.nodes:
            assert node.kind and node.text and node.signals
            assert node.provenance, node
            assert all(t in index.turns for t in node.provenance)
            assert node.turn_ids == [index.turns[t].turn_id for t in node.provenance]
            assert node.session_ids
        assert res.turns and all(t.node_id in index.turns for t in res.turns)
        assert res.context.startswith("[")


def test_auto_ranks_exact_turn_first(cache):
    strategy = get_strategy("auto", retrieve_config())
    for tenant in cache.tenants():
        target, query = _question(cache, tenant)
        res = run_search(cache.get(tenant), strategy, query, 5)
        assert res.turns[0].node_id == target.node_id, (tenant, query)
        assert {"maxsim", "session_prior", "adjacent"} <= set(res.nodes[0].signals)


def test_auto_falls_back_without_graph(cache):
    tenant = cache.tenants()[0]
    index = cache.get(tenant)
    index._memlib_graph_view = None  # as graph_view() records a tenant without a graph file
    try:
        res = run_search(index, get_strategy("auto", retrieve_config(), graph_weight=0.5), "kitten shelter", 5)
        assert res.nodes and "graph" not in res.nodes[0].signals
    finally:
        del index._memlib_graph_view


def test_unknown_param_rejected():
    from memlib.retrieve.base import RetrievalError

    with pytest.raises(RetrievalError):
        get_strategy("magma", None, nope=1)
