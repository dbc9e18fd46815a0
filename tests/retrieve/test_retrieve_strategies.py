"""Every strategy on a store built from the sample conversations: ranked results with
kind, text, score, signals and provenance to real turns."""
from __future__ import annotations

import pytest

from memlib.retrieve.kernels import run_search
from memlib.retrieve.registry import get_strategy, list_strategies
from memlib.retrieve.signals import turn_frame
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


@pytest.mark.parametrize("name", ["bm25", "dense", "hybrid", *STRATEGIES])
def test_a_query_without_words_is_answered(cache, name):
    # an empty query embeds to a zero vector: gaama had no PPR seed of positive weight and raised
    index = cache.get(cache.tenants()[0])
    for query in ("", "!!!"):
        res = run_search(index, get_strategy(name, retrieve_config()), query, 5)
        assert all(t in index.turns for node in res.nodes for t in node.provenance)


def test_auto_ranks_exact_turn_first(cache):
    strategy = get_strategy("auto", retrieve_config())
    for tenant in cache.tenants():
        target, query = _question(cache, tenant)
        res = run_search(cache.get(tenant), strategy, query, 5)
        assert res.turns[0].node_id == target.node_id, (tenant, query)
        assert {"maxsim", "session_prior", "adjacent"} <= set(res.nodes[0].signals)


def test_auto_falls_back_without_graph(cache):
    from memlib.retrieve.tenant import TenantIndex

    tenant = cache.tenants()[0]
    index = TenantIndex(cache.reader, tenant, cache.embedder)  # a view of its own: the cache's stays as it is
    index.memo("graph_view", lambda: None)  # as graph_view() records a tenant without a graph file
    res = run_search(index, get_strategy("auto", retrieve_config(), graph_weight=0.5), "kitten shelter", 5)
    assert res.nodes and "graph" not in res.nodes[0].signals


def test_tenant_memo_is_single_flight_per_key_and_retries_a_failed_build(cache):
    import threading
    import time

    from memlib.retrieve.tenant import TenantIndex

    index = TenantIndex(cache.reader, cache.tenants()[0], cache.embedder)
    calls: list[str] = []

    def slow(key: str):
        def build():
            calls.append(key)
            time.sleep(0.2)
            return object()
        return build

    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(index.memo("a", slow("a")))) for _ in range(8)]
    started = time.perf_counter()
    for th in threads:
        th.start()
    assert index.memo("b", lambda: "b") == "b"  # another key does not wait for "a"
    assert time.perf_counter() - started < 0.15
    for th in threads:
        th.join()
    assert calls == ["a"] and len({id(g) for g in got}) == 1

    def boom():
        raise RuntimeError("no")
    with pytest.raises(RuntimeError):
        index.memo("c", boom)
    assert index.memo("c", lambda: 3) == 3


def test_unknown_param_rejected():
    from memlib.retrieve.base import RetrievalError

    with pytest.raises(RetrievalError):
        get_strategy("magma", None, nope=1)


def _without_references(store, copy):
    """A copy of ``store`` whose tenants have no ``auto`` matrix reference: a query encodes them."""
    import shutil

    from memlib.io.store import StoreReader

    shutil.copytree(store, copy)
    version = StoreReader(copy).version_dir
    shutil.rmtree(version / "matrix_refs")
    shutil.rmtree(version / "view_turns")  # its batches carry the reference too
    return copy


def test_auto_token_matrix_disk_cache_is_keyed_by_content(sample_store, tmp_path, monkeypatch):
    """auto's token matrices: one file per tenant named by the content it encodes; a fresh process
    view reads it instead of encoding; a corrupt file is re-encoded; a tenant's new matrix
    replaces its older files and leaves a tenant whose id merely extends this one alone. (The
    store's tenants have no matrix reference here, as when their kept sessions are gone.)"""
    from memlib.embed import token_encoder
    from memlib.retrieve import matrix_cache
    from memlib.retrieve.tenant_cache import TenantCache

    sample_store = _without_references(sample_store, tmp_path / "store")
    cache_dir = tmp_path / "late"
    strategy = get_strategy("auto", retrieve_config(), cache_dir=str(cache_dir))
    tenant = TenantCache(sample_store).tenants()[0]
    stale, other = cache_dir / f"late-{tenant}-{'0' * 20}.npz", cache_dir / f"late-{tenant}-x-{'1' * 20}.npz"
    cache_dir.mkdir()
    stale.write_bytes(b"old")
    other.write_bytes(b"other tenant")

    first = run_search(TenantCache(sample_store).get(tenant), strategy, "kitten shelter", 5)
    index = TenantCache(sample_store).get(tenant)
    texts = [index.texts[index.row_of[t]] if t in index.row_of else index.turns[t].text for t in index.turn_order]
    tag = token_encoder.get_encoder(1).tag
    key = matrix_cache.content_key(index.turn_order, texts, tag)
    assert sorted(p.name for p in cache_dir.iterdir()) == sorted([f"late-{tenant}-{key}.npz", other.name])
    assert matrix_cache.content_key(index.turn_order, texts[:-1] + [texts[-1] + "!"], tag) != key
    assert matrix_cache.content_key(index.turn_order, texts, "another-encoder") != key

    def no_encoding(*a, **k):
        raise AssertionError("the cached matrix should have been read")

    monkeypatch.setattr(matrix_cache, "build_token_matrix", no_encoding)
    again = run_search(index, strategy, "kitten shelter", 5)
    assert [t.node_id for t in again.turns] == [t.node_id for t in first.turns]

    monkeypatch.undo()
    (cache_dir / f"late-{tenant}-{key}.npz").write_bytes(b"torn write")
    third = run_search(TenantCache(sample_store).get(tenant), strategy, "kitten shelter", 5)
    assert [t.node_id for t in third.turns] == [t.node_id for t in first.turns]
    assert (cache_dir / f"late-{tenant}-{key}.npz").stat().st_size > 1000


def test_auto_first_queries_of_a_tenant_build_its_matrix_once(sample_store, tmp_path, monkeypatch):
    """Concurrent first queries of one tenant (a server's thread pool) share one encoding."""
    import threading
    import time

    from memlib.retrieve import matrix_cache
    from memlib.retrieve.tenant_cache import TenantCache

    real, calls = matrix_cache.build_token_matrix, []

    def slow_build(*args, **kwargs):
        calls.append(1)
        time.sleep(0.3)  # long enough for every thread to arrive while the first one encodes
        return real(*args, **kwargs)

    monkeypatch.setattr(matrix_cache, "build_token_matrix", slow_build)
    cache = TenantCache(_without_references(sample_store, tmp_path / "store"))
    index = cache.get(cache.tenants()[0])
    strategy = get_strategy("auto", retrieve_config(), cache_dir=str(tmp_path / "late"))
    results, errors = [], []

    def query():
        try:
            results.append([t.node_id for t in run_search(index, strategy, "kitten shelter", 5).turns])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=query) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 6 and all(r == results[0] for r in results)
    assert len(calls) == 1


def test_build_precomputes_auto_token_matrices(sample_store, monkeypatch):
    """With retrieve.precompute_token_matrices (set by the fixture's build), `memlib build`
    records every tenant's token matrix before it publishes, as a reference to the token vectors
    its sessions kept (no second copy), and a fresh view of the store answers auto without
    encoding the tenant."""
    from memlib.io.store import StoreReader
    from memlib.retrieve import matrix_cache
    from memlib.retrieve.tenant_cache import TenantCache

    cache = TenantCache(sample_store)
    refs = StoreReader(sample_store).table("matrix_refs")
    assert sorted(refs.column("tenant_id").to_pylist()) == sorted(cache.tenants())
    late = sample_store / "cache" / "late"
    assert not late.exists() or not list(late.iterdir())  # no file per tenant: the references are in the parts

    def no_encoding(*a, **k):
        raise AssertionError("the build should have written this tenant's matrix")

    monkeypatch.setattr(matrix_cache, "build_token_matrix", no_encoding)
    for tenant in cache.tenants():
        assert run_search(cache.get(tenant), get_strategy("auto", retrieve_config()), "weekend plans", 3).turns


def test_a_store_of_the_earlier_layout_reads_its_matrix_reference_files(sample_store, tmp_path, monkeypatch):
    """A store written before references moved into the parts holds one reference file per tenant
    in ``cache/late``: its tenants still answer ``auto`` from their kept sessions, unencoded."""
    import json
    import shutil

    from memlib.io.store import StoreReader
    from memlib.retrieve import matrix_cache
    from memlib.retrieve.tenant_cache import TenantCache

    store = tmp_path / "store"
    shutil.copytree(sample_store, store)
    reader = StoreReader(store)
    late = store / "cache" / "late"
    late.mkdir(parents=True, exist_ok=True)
    for ref in reader.table("matrix_refs").to_pylist():
        body = {"format": matrix_cache.CACHE_FORMAT, "session_build_key": ref["session_build_key"],
                "sessions": ref["sessions"]}
        name = f"late-{ref['tenant_id']}-{ref['content_key']}{matrix_cache.REFERENCE_SUFFIX}"
        (late / name).write_text(json.dumps(body), encoding="utf-8")
    shutil.rmtree(reader.version_dir / "matrix_refs")
    shutil.rmtree(reader.version_dir / "view_turns")  # written before views too: no reference there

    def no_encoding(*a, **k):
        raise AssertionError("the reference file should have given this tenant's matrix")

    monkeypatch.setattr(matrix_cache, "build_token_matrix", no_encoding)
    cache = TenantCache(store)
    for tenant in cache.tenants():
        assert run_search(cache.get(tenant), get_strategy("auto", retrieve_config()), "weekend plans", 3).turns


def test_auto_assistant_penalty_lowers_assistant_turns_only(cache):
    tenant = cache.tenants()[0]
    index = cache.get(tenant)
    frame = turn_frame(index)
    assert frame.assistant.any() and not frame.assistant.all()  # the sample has both roles
    query = "what should I cook for the night shifts?"
    def scores(penalty):
        strategy = get_strategy("auto", retrieve_config(), assistant_penalty=penalty, session_lead=0.0)
        return {n.node_id: n.score for n in strategy.search(index, query, len(frame.ids))}

    plain, penalized = scores(0.0), scores(1.5)
    for nid, score in plain.items():
        drop = 1.5 if frame.assistant[frame.pos[nid]] else 0.0
        assert penalized[nid] == pytest.approx(score - drop)


def test_personalai_reaches_an_assistant_reply_through_turn_starts(cache):
    """An assistant's reply is not mined for entities (gate.extract_roles), so no entity start
    leads to it; the turns nearest the query join the starts (``start_turns``) and reach it."""
    index = cache.get("maya")
    reply = next(t for t in index.turns.values() if t.role == "assistant" and "lentil curry" in t.text)
    query = "which two big batches did you suggest, a lentil curry and roasted vegetables?"
    with_turns = run_search(index, get_strategy("personalai", retrieve_config()), query, 10)
    assert reply.node_id in [t.node_id for t in with_turns.turns[:3]]
    entities_only = run_search(index, get_strategy("personalai", retrieve_config(), start_turns=0), query, 10)
    assert reply.node_id not in [n.node_id for n in entities_only.nodes]


def test_a_matrix_reference_to_sessions_no_longer_kept_is_encoded_again(sample_store, tmp_path):
    """A tenant whose matrix reference names kept sessions that are gone (a cache deleted by
    hand) is encoded on its first query, and the encoded matrix is kept for the next process."""
    import shutil

    from memlib.retrieve import matrix_cache
    from memlib.retrieve.tenant_cache import TenantCache

    store = tmp_path / "store"
    shutil.copytree(sample_store, store)
    shutil.rmtree(store / "cache" / "sessions")
    cache = TenantCache(store)
    tenant = cache.tenants()[0]
    hits = run_search(cache.get(tenant), get_strategy("auto", retrieve_config()), "weekend plans", 3).turns
    assert hits
    late = store / "cache" / "late"
    assert [p.name.startswith(f"late-{tenant}-") for p in late.glob("*.npz")] == [True]
    assert not list(late.glob(f"late-{tenant}-*{matrix_cache.REFERENCE_SUFFIX}"))  # replaced by the npz
