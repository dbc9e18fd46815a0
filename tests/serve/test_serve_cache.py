"""The replica's tenant cache: bounded by bytes, least recently used out first; a publish keeps
loaded the tenants no version in between rebuilt; a query that started on a version finishes on
it; cache counts in /metrics; the most asked tenants preloaded from, and saved to, a file."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from memlib.io.store import StoreWriter
from memlib.retrieve.kernels import run_search
from memlib.retrieve.registry import get_strategy
from memlib.retrieve.tenant import approx_bytes
from memlib.retrieve.tenant_cache import TenantCache
from tests.serve.conftest import CONVERSATIONS, DIM, _tables, serve_config


def _publish(path: Path, emb, changed: dict[str, str], base: str | None, status: dict[str, str] | None = None) -> str:
    """A version of the two-tenant store in which each tenant of ``changed`` has its texts with
    that suffix appended, the manifest naming each tenant's status and the version it was built from."""
    w = StoreWriter(path, dim=DIM)
    nodes = []
    for tenant in CONVERSATIONS:
        turns, n = _tables(tenant, emb, changed.get(tenant, ""))
        w.write_table("turns", tenant, turns)
        nodes.append(n)
    w.replace_tenant_nodes(list(CONVERSATIONS), pa.concat_tables(nodes))
    w.index_nodes()
    status = status or {t: "built" if t in changed or base is None else "carried" for t in CONVERSATIONS}
    manifest = {"tenants": {t: {"status": status[t]} for t in CONVERSATIONS}}
    if base is not None:
        manifest["base_version"] = base
    return w.publish(manifest)["version"]


def _texts(idx) -> list[str]:
    return sorted(idx.turns[n].text for n in idx.turn_order)


def _cfg():
    return serve_config()


def test_sizes_count_what_a_tenant_holds(store, embedder):
    cache = TenantCache(store, embedder=embedder)
    alice = cache.get("alice")
    opened = alice.nbytes
    # columns are made into Python objects when first read, and counted from then on
    texts, embeddings = alice.texts, alice.embeddings
    base = alice.nbytes
    assert base >= opened + sum(len(t) for t in texts) and base >= embeddings.nbytes + sum(len(t) for t in texts)
    assert cache.nbytes == base
    alice.memo("a big derived table", lambda: np.zeros(100_000, np.float64))
    assert alice.nbytes >= base + 800_000 and cache.nbytes == alice.nbytes
    # a memoized value that refers back to its tenant view counts only what it adds
    alice.memo("refers back", lambda: {"index": alice, "rows": np.arange(10)})
    assert alice.nbytes < base + 800_000 + 10_000
    assert approx_bytes({"a": np.zeros(1000, np.float32), "b": ["x" * 100]}) >= 4000 + 100


def test_bytes_bound_the_cache_least_recently_used_out_first(store, embedder):
    sizes = {t: TenantCache(store, embedder=embedder).get(t).nbytes for t in CONVERSATIONS}
    cache = TenantCache(store, embedder=embedder, max_bytes=sizes["alice"] + sizes["bob"] - 1)
    cache.get("alice")
    cache.get("bob")  # both do not fit: alice, least recently used, goes
    assert cache.loaded() == ["bob"] and cache.stats.evictions == 1 and cache.stats.misses == 2
    cache.get("bob")
    assert cache.stats.hits == 1
    cache.get("alice")
    assert cache.loaded() == ["alice"] and cache.stats.evictions == 2 and cache.stats.misses == 3
    # a tenant larger than the whole cache is still served, alone
    tiny = TenantCache(store, embedder=embedder, max_bytes=1)
    tiny.get("alice")
    tiny.get("bob")
    assert tiny.loaded() == ["bob"]
    # a count bound as well, when given
    two = TenantCache(store, embedder=embedder, max_tenants=1)
    two.get("alice")
    two.get("bob")
    assert two.loaded() == ["bob"] and two.stats.evictions == 1
    assert len(cache.stats.load_s) == 3 and all(s > 0 for s in cache.stats.load_s)


def test_a_publish_keeps_unchanged_tenants_loaded(tmp_path, embedder):
    store = tmp_path / "store"
    v1 = _publish(store, embedder, {}, None)
    cache = TenantCache(store, embedder=embedder)
    old_alice, old_bob = cache.get("alice"), cache.get("bob")
    old_alice.memo("derived", lambda: np.ones(10))
    bm25 = get_strategy("bm25", _cfg())
    v2 = _publish(store, embedder, {"bob": " It rained."}, v1)
    assert cache.refresh() and cache.version == v2
    assert cache.loaded() == ["alice"] and cache.stats.kept_on_refresh == 1 and cache.stats.dropped_on_refresh == 1
    misses = cache.stats.misses
    alice = cache.get("alice")
    assert cache.stats.misses == misses  # not reloaded
    assert alice is not old_alice and alice.version == v2 and old_alice.version == v1
    assert alice.embeddings is old_alice.embeddings and alice.memo("derived", lambda: None) is not None
    bob = cache.get("bob")
    assert cache.stats.misses == misses + 1  # rebuilt: loaded again, from v2
    assert all(t.endswith(" It rained.") for t in _texts(bob))
    # a query that started on v1 (it holds v1's view) finishes on v1
    old_hit = run_search(old_bob, bm25, "bicycle", 2)
    new_hit = run_search(bob, bm25, "bicycle", 2)
    assert old_hit.nodes and not any("rained" in n.text for n in old_hit.nodes)
    assert new_hit.nodes and all("rained" in n.text for n in new_hit.nodes)
    # alice searches v2's tables through the kept view
    assert run_search(alice, bm25, "risotto", 1).nodes[0].text.startswith("My favourite food")

    # two versions at once (the replica missed one): alice carried by both, so kept
    v3 = _publish(store, embedder, {"bob": " It snowed."}, v2)
    v4 = _publish(store, embedder, {"bob": " It hailed."}, v3, status={"alice": "failed", "bob": "built"})
    cache.get("bob")
    assert cache.refresh() and cache.version == v4 and cache.loaded() == ["alice"]
    # alice rebuilt: dropped
    _publish(store, embedder, {"alice": " Changed."}, v4)
    assert cache.refresh() and cache.loaded() == []


def test_a_rollback_or_a_broken_link_keeps_nothing(tmp_path, embedder):
    from jobs.store_maintenance import rollback

    store = tmp_path / "store"
    v1 = _publish(store, embedder, {}, None)
    v2 = _publish(store, embedder, {"bob": " x"}, v1)
    cache = TenantCache(store, embedder=embedder)
    cache.get("alice")
    rollback(store, v1)  # v1 again: older than what is loaded, not a descendant of it
    assert cache.refresh() and cache.version == v1 and cache.loaded() == []
    cache.get("alice")
    v3 = _publish(store, embedder, {"bob": " y"}, v2)  # built from v2, which the replica never loaded from v1
    (store / "manifests" / f"{v2}.json").write_text("{ damaged", encoding="utf-8")
    assert cache.refresh() and cache.version == v3 and cache.loaded() == []
    cache.get("alice")
    _publish(store, embedder, {"bob": " z"}, None, status={"alice": "carried", "bob": "built"})  # no link
    assert cache.refresh() and cache.loaded() == []


def test_metrics_and_hot_tenants_file(store, embedder, tmp_path):
    from memlib.serve.models import SearchRequest
    from memlib.serve.service import SearchService

    hot = tmp_path / "hot.txt"
    hot.write_text("bob\nnobody\nalice\n", encoding="utf-8")
    svc = SearchService(store, serve_config(hot_tenants_file=str(hot), preload_tenants=0), embedder=embedder).start()
    try:
        assert svc.cache.loaded() == ["bob", "alice"]  # unknown tenants skipped, most asked loaded first
        for tenant in ("alice", "alice", "bob"):
            svc.search(SearchRequest(tenant=tenant, query="what", strategy="bm25", k=3))
        text = svc.metrics.render().decode()
        for name in ("memlib_cache_hits_total 3.0", "memlib_cache_misses_total 2.0", "memlib_cache_evictions_total",
                     "memlib_cache_bytes ", "memlib_cache_max_bytes ", "memlib_tenant_load_seconds_count 2.0"):
            assert name in text, name
        value = next(line for line in text.splitlines() if line.startswith("memlib_cache_bytes "))
        assert float(value.split()[1]) == svc.cache.nbytes > 0
    finally:
        svc.stop()
    assert hot.read_text(encoding="utf-8").split() == ["alice", "bob", "nobody"]


@pytest.mark.parametrize("content", [b"\xff\xfe\x00 not text", b""])
def test_an_unreadable_hot_tenants_file_preloads_nothing(store, embedder, tmp_path, content):
    from memlib.serve.service import SearchService

    hot = tmp_path / "hot.txt"
    hot.write_bytes(content)
    svc = SearchService(store, serve_config(hot_tenants_file=str(hot), preload_tenants=0), embedder=embedder).start()
    svc.stop()
    assert svc.cache.loaded() == []
    assert json.dumps(svc.health().model_dump())  # still healthy


def test_many_tenant_load_in_process(store, embedder):
    """The many-tenant bench's load: Zipf draws, cold requests, the cache's hit rate."""
    from collections import Counter

    from jobs.bench.serve_tenants import InProcess, run, zipf_draws

    draws = Counter(zipf_draws([f"t{i}" for i in range(100)], 20_000, 1.1, seed=3))
    top = [n for _, n in draws.most_common()]
    assert top[0] > 5 * top[20] and len(draws) > 60  # heavy head, long tail
    client = InProcess(store, serve_config(cache_tenants=1, preload_tenants=0), embedder=embedder)
    try:
        out = run(client, {"alice": ["risotto"], "bob": ["bicycle"]}, ["bm25"], 200, 2, 0.5, 3, warm=20)
    finally:
        client.close()
    s = out["strategies"]["bm25"]
    assert s["requests"] == 200 and out["errors"] == 0 and s["p50_ms"] > 0
    assert 0 < s["cold_requests"] < 200 and 0 < out["hit_rate"] < 1 and out["evictions"] > 0


def test_a_cold_tenants_query_is_encoded_while_it_opens(store, embedder):
    """A search for a cold tenant has its query encoded on another thread while the tenant opens;
    the search takes that encoding (same arrays as encoding it itself) and leaves none behind."""
    from memlib.embed import token_encoder
    from memlib.serve.models import SearchRequest
    from memlib.serve.service import SearchService

    enc = token_encoder.get_encoder(1)
    query = "what did alice cook for the party"
    ids, vecs = enc.encode([query])[0]
    enc.encode_ahead(query)
    got = enc.encode_query(query)
    assert np.array_equal(got[0], ids) and np.array_equal(got[1], vecs) and query not in enc._ahead

    svc = SearchService(store, serve_config(preload_tenants=0), embedder=embedder).start()
    auto, seen = svc.strategy("auto"), []
    ahead = auto.prefetch
    auto.prefetch = lambda q: (seen.append(q), ahead(q))
    try:
        cold = svc.search(SearchRequest(tenant="alice", query=query, strategy="auto", k=3))
        assert seen == [query] and query not in enc._ahead  # encoded ahead, then taken by the search
        warm = svc.search(SearchRequest(tenant="alice", query=query, strategy="auto", k=3))
        assert seen == [query]  # a loaded tenant's query is encoded by its search
        assert [t.turn_id for t in cold.turns] == [t.turn_id for t in warm.turns]
    finally:
        svc.stop()

    calls = []

    def failing(texts):
        calls.append(texts)
        raise RuntimeError("encoder down")

    broken = object.__new__(token_encoder.TokenEncoder)
    broken.__dict__.update(enc.__dict__, _ahead=type(enc._ahead)(), encode=failing)
    broken.encode_ahead("x")
    with pytest.raises(RuntimeError, match="encoder down"):
        broken.encode_query("x")  # the error reaches the one who asks
    assert len(calls) == 1
