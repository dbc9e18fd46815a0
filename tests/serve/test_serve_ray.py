"""A real HTTP round trip against the Ray Serve app on loopback, over a store built by
`memlib build` from the bundled sample conversations (one Serve start-up for the module)."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from memlib.client import (
    AuthenticationError,
    InvalidRequestError,
    MemlibClient,
    PermissionDeniedError,
    TenantNotFoundError,
)
from memlib.io.store import StoreReader, StoreWriter, read_manifest
from tests.serve.conftest import ADMIN, TOKENS, build_sample, serve_config

pytestmark = pytest.mark.ray
SAMPLE = "memlib/data/sample_conversations.jsonl"
TOKENS_BY_TENANT = {"maya": TOKENS["alice"], "raj": TOKENS["bob"]}


@pytest.fixture(scope="module")
def built_store(tmp_path_factory):
    out = tmp_path_factory.mktemp("serve") / "store"
    return build_sample(out, "--recipe", "turns")


@pytest.fixture(scope="module")
def service_url(built_store, request):
    request.getfixturevalue("ray_local")
    from ray import serve

    from jobs.serve import free_port, start

    cfg = serve_config(poll_interval_s=0.0)
    cfg.serve.tenant_token_hashes = {t: cfg.serve.tenant_token_hashes[a]
                                     for t, a in (("maya", "alice"), ("raj", "bob"))}
    url = start(built_store, cfg, host="127.0.0.1", port=free_port(), timeout_s=600)
    yield url
    serve.shutdown()


def test_round_trip_with_provenance_to_real_turns(service_url, built_store):
    with MemlibClient(service_url, TOKENS_BY_TENANT["maya"]) as c:
        assert c.health().status == "ok"
        assert c.tenants() == ["maya"]
        resp = c.search("maya", "does Maya eat coriander?", strategy="bm25", k=5)
    assert resp.version == read_manifest(built_store)["version"] and resp.results
    turns = StoreReader(built_store).table("turns", "maya", columns=["turn_id", "text"]).to_pylist()
    by_id = {t["turn_id"]: t["text"] for t in turns}
    for node in resp.results:
        assert node.turn_ids and all(tid in by_id for tid in node.turn_ids)
    assert any("coriander" in by_id[t.turn_id] for t in resp.turns)
    assert resp.context and resp.latency_ms > 0


def test_typed_client_errors(service_url):
    with MemlibClient(service_url) as anon, pytest.raises(AuthenticationError) as e:
        anon.search("maya", "anything", strategy="bm25")
    assert e.value.status == 401
    with MemlibClient(service_url, TOKENS_BY_TENANT["raj"]) as c, pytest.raises(PermissionDeniedError):
        c.search("maya", "anything", strategy="bm25")
    with MemlibClient(service_url, ADMIN) as admin:
        with pytest.raises(TenantNotFoundError):
            admin.search("nobody", "anything", strategy="bm25")
        with pytest.raises(InvalidRequestError) as e:
            admin.search("../maya", "anything", strategy="bm25")
        assert e.value.code == "bad_tenant_id"
        with pytest.raises(InvalidRequestError) as e:
            admin.search("maya", "anything", strategy="no-such-strategy")
        assert e.value.code == "unknown_strategy"
        assert sorted(admin.tenants()) == ["elena", "maya", "raj", "tomas-lena"]


def test_oversize_body_metrics_and_docs(service_url):
    with MemlibClient(service_url, ADMIN) as admin:  # a successful search of its own (the test runs alone too)
        assert admin.search("maya", "night shifts", strategy="bm25")
    body = json.dumps({"tenant": "maya", "query": "x" * 20_000}).encode()
    r = httpx.post(f"{service_url}/v1/search", content=body, headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 422 and r.json()["error"] == "body_too_large"
    assert httpx.get(f"{service_url}/openapi.json").status_code == 200
    text = httpx.get(f"{service_url}/metrics").text
    assert 'memlib_requests_total{endpoint="search",status="200",strategy="bm25"}' in text
    assert 'memlib_requests_total{endpoint="search",status="422"' in text
    assert "memlib_search_latency_seconds_bucket" in text


def test_reload_serves_a_newly_published_version(service_url, built_store):
    base = read_manifest(built_store)
    w = StoreWriter(built_store, dim=StoreReader(built_store).dim)
    for tenant in base["tenants"]:
        w.carry_over(tenant)
    new = w.publish({k: v for k, v in base.items() if k not in ("version", "lance_version")})["version"]
    assert new != base["version"]
    with MemlibClient(service_url, ADMIN) as admin:
        assert admin.search("maya", "coriander", strategy="bm25").version == base["version"]
        r = admin.reload()
        assert r.changed and r.version == new and r.previous == base["version"]
        assert admin.search("maya", "coriander", strategy="bm25").version == new
    with MemlibClient(service_url, TOKENS_BY_TENANT["maya"]) as c, pytest.raises(PermissionDeniedError):
        c.reload()


def test_queries_during_a_publish_see_one_whole_version(service_url, built_store, tmp_path):
    """A client keeps searching (and reloading) through Serve while `memlib build --incremental`
    publishes a new version of the same store: no request fails, every answer names the old
    or the new version, and every turn in it is exactly that version's turn."""
    import threading
    from pathlib import Path

    new_line = {"tenant_id": "maya", "conversation_id": "maya-main", "session_id": "s9",
                "session_time": "2024-03-02T10:00:00+00:00", "turn_id": "s9:1", "speaker": "Maya",
                "role": "user", "text": "I planted a kumquat tree on the balcony this morning."}
    inp = tmp_path / "in.jsonl"
    inp.write_text(Path(SAMPLE).read_text(encoding="utf-8") + json.dumps(new_line) + "\n", encoding="utf-8")
    before = read_manifest(built_store)["version"]
    stop, answers, errors = threading.Event(), [], []

    def client_loop() -> None:
        with MemlibClient(service_url, ADMIN, timeout=60) as admin:
            i = 0
            while not stop.is_set():
                try:
                    if i % 3 == 0:
                        admin.reload()
                    answers.append(admin.search("maya", "kumquat tree balcony", strategy="bm25", k=5))
                except Exception as exc:  # noqa: BLE001 - the test records every failure
                    errors.append(repr(exc))
                i += 1

    reader = threading.Thread(target=client_loop, daemon=True)
    reader.start()
    try:
        proc = subprocess.run([sys.executable, "-m", "jobs.cli", "build", "--incremental", "-i", str(inp), "-f",
                               "jsonl", "-o", str(built_store), "--recipe", "turns", "--num-cpus", "2"],
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        with MemlibClient(service_url, ADMIN) as admin:
            admin.reload()
            after = admin.search("maya", "kumquat tree balcony", strategy="bm25", k=5)
            answers.append(after)
    finally:
        stop.set()
        reader.join(60)
    new = read_manifest(built_store)["version"]
    assert new != before and after.version == new
    assert not errors, errors[:3]
    assert len(answers) > 3, "the client kept querying during the build"
    turns_of = {}
    for v in {a.version for a in answers}:
        assert v in (before, new)
        manifest = json.loads((built_store / "manifests" / f"{v}.json").read_text())
        rows = StoreReader(built_store, manifest=manifest).table("turns", "maya", columns=["turn_id", "text"])
        turns_of[v] = {r["turn_id"]: r["text"] for r in rows.to_pylist()}
    assert "s9:1" not in turns_of[before] and "s9:1" in turns_of[new]
    for a in answers:
        for hit in a.turns:
            assert turns_of[a.version].get(hit.turn_id) == hit.text, (a.version, hit.turn_id)
    assert any(h.turn_id == "s9:1" for h in after.turns)
