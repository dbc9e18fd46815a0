from __future__ import annotations

import pytest

from memlib.config import MemlibConfig
from memlib.retrieve import kernels
from memlib.retrieve.base import RetrievalError
from memlib.retrieve.registry import UnknownStrategyError, get_strategy, list_strategies
from memlib.retrieve.tenant_cache import TenantCache
from tests.eval.conftest import TENANT


@pytest.fixture(scope="module")
def cache(tiny_store, hash_embedder):
    return TenantCache(tiny_store, embedder=hash_embedder)


def test_registry_lists_baselines_and_rejects_unknown():
    names = list_strategies()
    assert {"bm25", "dense", "hybrid"} <= set(names)
    with pytest.raises(UnknownStrategyError) as err:
        get_strategy("nope")
    assert "bm25" in str(err.value) and "nope" in str(err.value)


def test_strategy_params_from_config_and_unknown_param():
    cfg = MemlibConfig()
    cfg.retrieve.params = {"hybrid": {"pool": 7}}
    assert get_strategy("hybrid", cfg).params["pool"] == 7
    assert get_strategy("hybrid").params["pool"] == 100
    with pytest.raises(RetrievalError, match="unknown parameter"):
        get_strategy("bm25", None, bogus=1)


@pytest.mark.parametrize("name", ["bm25", "dense", "hybrid"])
def test_baselines_return_real_turns_with_provenance(cache, name):
    idx = cache.get(TENANT)
    res = kernels.run_search(idx, get_strategy(name), "Biscuit the golden retriever puppy", k=3)
    assert res.nodes, name
    assert all(n.kind == "turn" and n.provenance == [n.node_id] for n in res.nodes)
    assert set(res.turn_ids) <= {t.turn_id for t in idx.turns.values()}
    assert res.turn_ids[0] in {"D1:1", "D1:3"}
    assert res.nodes[0].session_ids == ["S1"] and res.nodes[0].times[0] is not None
    assert res.latency_ms > 0 and "D1:" in res.context


def test_fts_query_is_sanitized(cache):
    idx = cache.get(TENANT)
    hits = kernels.lance_fts(idx, 'Biscuit\'s "breed": (AND) OR* ~ ^2 [x]', 5, ["turn"])
    assert hits and all(h[0].startswith("turn:") for h in hits)
    assert kernels.lance_fts(idx, "?!:", 5) == []


def test_fact_expands_to_its_turns_in_rank_order(cache):
    idx = cache.get(TENANT)
    nodes = kernels.make_nodes(idx, kernels.knn(idx, idx.embed_query("sister Berlin violin"), 3, ["fact", "turn"]))
    assert nodes[0].kind == "fact" and nodes[0].turn_ids == ["D2:2", "D2:3"]
    turns = kernels.expand_to_turns(idx, nodes)
    tids = [t.turn_id for t in turns]
    assert tids[:2] == ["D2:2", "D2:3"] and len(tids) == len(set(tids))


def test_rrf_orders_by_fused_rank():
    fused = kernels.rrf([[("a", 9), ("b", 8), ("c", 1)], [("c", 0.9), ("b", 0.8)]], k=60)
    assert [n for n, _ in fused] == ["c", "b", "a"]  # 1/63+1/61 > 2/62
    assert fused[1][1] == pytest.approx(2 / 62) and fused[2][1] == pytest.approx(1 / 61)


def test_hybrid_fusion_keeps_a_turn_one_ranker_puts_first():
    # hybrid's cross-validated constant (docs/decisions/0017-hybrid-rrf.md): a turn only BM25 finds, at rank 1,
    # stays above one both rankers put 10th; with Cormack's 60 it fell below it.
    from memlib.retrieve.baselines import Hybrid

    lex = [("only-lex", 9.0)] + [(f"l{i}", 8.0 - i / 10) for i in range(8)] + [("both", 1.0)]
    vec = [(f"v{i}", 0.9 - i / 100) for i in range(9)] + [("both", 0.5)]
    fused = kernels.rrf([lex, vec], k=int(Hybrid.defaults["rrf_k"]))
    order = [n for n, _ in fused]
    assert order.index("only-lex") < order.index("both")
    assert [n for n, _ in kernels.rrf([lex, vec], k=60)].index("both") == 0


def test_pack_context_respects_word_budget(cache):
    idx = cache.get(TENANT)
    nodes = get_strategy("dense").search(idx, "violin Berlin", 6)
    ctx = kernels.pack_context(idx, nodes, word_budget=12)
    assert 1 <= len(ctx.splitlines()) < 6
    assert kernels.pack_context(idx, nodes, word_budget=2).count("\n") == 0


def test_cache_lru_and_refresh(tiny_store, hash_embedder):
    c = TenantCache(tiny_store, embedder=hash_embedder, max_tenants=1)
    assert c.get(TENANT) is c.get(TENANT)
    assert c.refresh() is False
    with pytest.raises(KeyError, match="unknown tenant"):
        c.get("ghost")
