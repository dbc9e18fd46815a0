"""The service's second hardening round, in-process over the synthetic store:
security headers of the explorer page, /docs off by default (its assets come from a CDN), HEAD on
/healthz and /v1/tenants, no file paths in /healthz without the admin token, and `memlib serve`
on a port in use or out of range refused in one line before Ray starts."""
from __future__ import annotations

import socket
import time

import pytest
from fastapi.testclient import TestClient

from memlib.io.store import StoreReader
from memlib.serve.app import build_app
from memlib.serve.service import SearchService
from tests.jobs.conftest import run_cli
from tests.serve.conftest import ADMIN, TOKENS, bearer, serve_config


@pytest.fixture()
def client(service):
    with TestClient(build_app(service)) as c:
        yield c


def test_explorer_page_has_security_headers(client):
    """Before: no Content-Security-Policy, X-Frame-Options or X-Content-Type-Options on /ui."""
    for path in ("/ui/", "/ui/explorer.js", "/ui/explorer.css"):
        r = client.get(path)
        assert r.status_code == 200, path
        csp = r.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "default-src 'none'" in csp
        assert r.headers.get("x-frame-options") == "DENY" and r.headers.get("x-content-type-options") == "nosniff"
    assert client.get("/ui", follow_redirects=False).headers.get("x-frame-options") == "DENY"


def test_api_docs_from_a_cdn_are_off_unless_enabled(client, store, embedder):
    """Before: /docs (Swagger UI from cdn.jsdelivr.net) was served by default."""
    assert client.get("/docs").status_code == 404 and client.get("/redoc").status_code == 404
    assert "/v1/search" in client.get("/openapi.json").json()["paths"]
    svc = SearchService(store, serve_config(api_docs=True), embedder=embedder).start()
    try:
        with TestClient(build_app(svc)) as c:
            assert c.get("/docs").status_code == 200
    finally:
        svc.stop()


def test_head_on_health_and_tenants(client):
    """Before: 405 Method Not Allowed for both."""
    r = client.head("/healthz")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json" and not r.content
    assert client.head("/v1/tenants").status_code == 401
    r = client.head("/v1/tenants", headers=bearer(TOKENS["alice"]))
    assert r.status_code == 200 and not r.content
    spec = client.get("/openapi.json").json()["paths"]
    assert set(spec["/healthz"]) == {"get"} and set(spec["/v1/tenants"]) == {"get"}


def test_healthz_names_files_only_for_the_admin(store, embedder, tmp_path):
    """Before: /healthz without a token gave broken tenants' reasons with absolute file paths."""
    turns = StoreReader(store).version_dir / "turns" / "alice.parquet"
    turns.write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1")
    svc = SearchService(store, serve_config(), embedder=embedder).start()
    try:
        with TestClient(build_app(svc)) as c:
            for headers in ({}, bearer(TOKENS["bob"]), bearer("not-a-token")):
                health = c.get("/healthz", headers=headers).json()
                assert health["status"] == "degraded" and "alice" in health["broken"], health
                assert str(tmp_path) not in health["broken"]["alice"] and "STORE/" in health["broken"]["alice"]
            admin = c.get("/healthz", headers=bearer(ADMIN)).json()
            assert str(turns.resolve()) in admin["broken"]["alice"] or str(turns) in admin["broken"]["alice"]
    finally:
        svc.stop()


def test_serve_on_a_port_in_use_or_out_of_range_is_one_line(store):
    """Before: Ray and Serve started and failed after ~18 s with an 88-line traceback (port in use);
    --port 70000 was a traceback too."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args, message in ((["--port", str(port)], f"port {port} on 127.0.0.1 is already in use"),
                              (["--port", "70000"], "--port 70000: a TCP port is 1-65535"),
                              (["--set", "serve.port=70000"], "serve.port")):
            t0 = time.monotonic()
            res = run_cli(["serve", "--store", str(store), "--set", "serve.auth_enabled=false", *args])
            lines = [ln for ln in res.output.splitlines() if ln.strip()]
            assert res.exit_code == 2 and len(lines) == 1 and message in lines[0], res.output
            assert time.monotonic() - t0 < 5
