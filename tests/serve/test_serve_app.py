"""The FastAPI app in-process (no Ray): auth, validation, search payload, metrics, docs, reload."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from memlib.serve.app import build_app
from memlib.serve.service import SearchService
from tests.serve.conftest import ADMIN, TOKENS, bearer, serve_config, write_version


@pytest.fixture()
def client(service):
    with TestClient(build_app(service)) as c:
        yield c


def _search(client, token=TOKENS["alice"], **body):
    payload = {"tenant": "alice", "query": "where did I go hiking", "strategy": "bm25", "k": 3}
    payload.update(body)
    headers = bearer(token) if token else {}
    return client.post("/v1/search", json=payload, headers=headers)


def test_search_round_trip_has_provenance(client, service):
    r = _search(client)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["version"] == service.cache.version and body["strategy"] == "bm25" and body["k"] == 3
    top = body["results"][0]
    assert "Alps" in top["text"] and top["kind"] == "turn" and top["turn_ids"] == ["a:1"]
    assert top["session_ids"] == ["s1"] and top["times"][0].startswith("2024-01-09")
    assert "bm25" in top["signals"] and body["turns"][0]["turn_id"] == "a:1"
    assert "a:1" in body["context"] and body["latency_ms"] >= body["search_ms"] >= 0


def test_every_registered_strategy_answers(client, service):
    for name in service.strategy_names:
        r = _search(client, strategy=name)
        assert r.status_code == 200, (name, r.text)
        assert r.json()["strategy"] == name


def test_admin_queries_any_tenant(client):
    r = _search(client, token=ADMIN, tenant="bob", query="bicycle")
    assert r.status_code == 200 and r.json()["results"][0]["turn_ids"] == ["b:1"]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic abc"}])
def test_401_without_a_valid_token(client, headers):
    r = client.post("/v1/search", json={"tenant": "alice", "query": "x"}, headers=headers)
    assert r.status_code == 401 and r.json()["error"] == "unauthenticated"


def test_403_for_another_tenants_token(client):
    r = _search(client, token=TOKENS["bob"])
    assert r.status_code == 403 and r.json()["error"] == "forbidden"


def test_404_for_unknown_tenant(client):
    r = _search(client, token=ADMIN, tenant="carol")
    assert r.status_code == 404 and "carol" in r.json()["reason"]


@pytest.mark.parametrize("body,code", [
    ({"tenant": "../alice", "query": "x"}, "bad_tenant_id"),
    ({"tenant": "alice/../../etc", "query": "x"}, "bad_tenant_id"),
    ({"tenant": "alice", "query": "x", "strategy": "nope"}, "unknown_strategy"),
    ({"tenant": "alice", "query": "x", "k": 0}, "bad_k"),
    ({"tenant": "alice", "query": "x", "k": 10_000}, "bad_k"),
    ({"tenant": "alice", "query": "x", "k": "5"}, "malformed_body"),
    ({"tenant": "alice"}, "malformed_body"),
    ({"tenant": "alice", "query": "x", "extra": 1}, "malformed_body"),
    ({"tenant": "alice", "query": "   "}, "malformed_body"),
])
def test_422_with_reason(client, body, code):
    r = client.post("/v1/search", json=body, headers=bearer(ADMIN))
    assert r.status_code == 422, r.text
    assert r.json()["error"] == code and r.json()["reason"]


def test_422_for_non_json_and_oversize(client, service):
    r = client.post("/v1/search", content=b"{not json", headers=bearer(ADMIN))
    assert r.status_code == 422 and r.json()["error"] == "malformed_body"
    r = client.post("/v1/search", content=b"[1, 2]", headers=bearer(ADMIN))
    assert r.status_code == 422 and "object" in r.json()["reason"]
    big = "x" * (service.limits.max_body_bytes + 1)
    r = client.post("/v1/search", json={"tenant": "alice", "query": big}, headers=bearer(ADMIN))
    assert r.status_code == 422 and r.json()["error"] == "body_too_large"


def test_tenants_are_scoped_to_the_token(client):
    assert client.get("/v1/tenants", headers=bearer(TOKENS["bob"])).json()["tenants"] == ["bob"]
    assert client.get("/v1/tenants", headers=bearer(ADMIN)).json()["tenants"] == ["alice", "bob"]
    assert client.get("/v1/tenants").status_code == 401


def test_health_docs_and_metrics(client):
    h = client.get("/healthz").json()
    assert h["status"] == "ok" and h["tenants"] == 2 and "bm25" in h["strategies"]
    assert client.get("/docs").status_code == 404  # its assets come from a CDN: off unless serve.api_docs
    spec = client.get("/openapi.json").json()
    assert "/v1/search" in spec["paths"] and "requestBody" in spec["paths"]["/v1/search"]["post"]
    _search(client)
    _search(client, token=None)
    text = client.get("/metrics").text
    assert 'memlib_requests_total{endpoint="search",status="200",strategy="bm25"} 1.0' in text
    assert 'memlib_requests_total{endpoint="search",status="401",strategy="-"} 1.0' in text
    assert 'memlib_search_latency_seconds_count{strategy="bm25"} 1.0' in text


def test_reload_picks_up_a_new_version(client, service, store, embedder):
    old = service.cache.version
    assert _search(client, query="penguin").json()["results"] == []
    assert client.post("/v1/reload", headers=bearer(TOKENS["alice"])).status_code == 403
    new = write_version(store, embedder, suffix=" penguin")
    assert _search(client, query="penguin").json()["version"] == old  # not yet reloaded
    r = client.post("/v1/reload", headers=bearer(ADMIN)).json()
    assert r == {"changed": True, "version": new, "previous": old}
    body = _search(client, query="penguin").json()
    assert body["version"] == new and body["results"] and all("penguin" in n["text"] for n in body["results"])
    assert client.post("/v1/reload", headers=bearer(ADMIN)).json()["changed"] is False


def test_poller_picks_up_a_new_version(store, embedder):
    import time

    svc = SearchService(store, serve_config(poll_interval_s=0.05), embedder=embedder).start()
    try:
        new = write_version(store, embedder, suffix=" walrus")
        deadline = time.monotonic() + 10
        while svc.cache.version != new and time.monotonic() < deadline:
            time.sleep(0.05)
        assert svc.cache.version == new
    finally:
        svc.stop()


def test_pinned_index_keeps_its_version(service, store, embedder):
    idx = service.index("alice")
    write_version(store, embedder, suffix=" later")
    assert service.refresh()
    assert idx.version != service.cache.version  # in-flight requests finish on the version they started with
    assert idx.table.search("later", query_type="fts").where("tenant_id = 'alice'").limit(5).to_arrow().num_rows == 0
