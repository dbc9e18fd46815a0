"""The service under a damaged store and hostile requests, over real HTTP against the Ray Serve app.
One store built by `memlib build` from the bundled sample, then
maya's turns file overwritten in the middle (a ZSTD page that no longer decodes) and its turns view
truncated, and raj's graph file truncated; one Serve start for the module."""
from __future__ import annotations

import socket
import subprocess
import sys

import httpx
import pytest

from memlib.io.store import StoreReader
from memlib.io.views import VIEW_TURNS, view_path
from tests.serve.conftest import ADMIN, build_sample, serve_config

pytestmark = pytest.mark.ray
SAMPLE = "memlib/data/sample_conversations.jsonl"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
def damaged_store(tmp_path_factory):
    out = tmp_path_factory.mktemp("degraded") / "store"
    # every tenant in a part of its own (tenant_batch_turns=1): the damage below is one tenant's
    build_sample(out, "--recipe", "turns", "--set", "ray.tenant_batch_turns=1")
    reader = StoreReader(out)
    turns = reader.table_file("turns", "maya")
    assert reader.part_of("maya") != reader.part_of("raj") != reader.part_of("elena")
    data = bytearray(turns.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8  # keep the footer: the file opens, its pages do not decode
    data[4:len(data) - footer] = b"\xa5" * (len(data) - footer - 4)
    turns.write_bytes(bytes(data))
    # and its turns view, which a tenant opens from first (a damaged view alone: read from the table)
    view = view_path(reader.version_dir, VIEW_TURNS, reader.part_of("maya"))
    view.write_bytes(view.read_bytes()[: view.stat().st_size // 2])
    graph = reader.graph_file("raj")
    graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 3])
    return out


@pytest.fixture(scope="module")
def url(damaged_store, request):
    request.getfixturevalue("ray_local")
    from ray import serve

    from jobs.serve import free_port, start

    base = start(damaged_store, serve_config(poll_interval_s=0.0), host="127.0.0.1", port=free_port(), timeout_s=240)
    yield base
    serve.shutdown()


def _search(url: str, tenant: str, strategy: str = "bm25", **kw) -> httpx.Response:
    body = {"tenant": tenant, "query": "what does she cook?", "strategy": strategy, "k": 5}
    return httpx.post(f"{url}/v1/search", json=body, headers=AUTH, timeout=60, **kw)


def _count(url: str, status: int) -> float:
    total = 0.0
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("memlib_requests_total{") and f'status="{status}"' in line and 'endpoint="search"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_corrupt_tenant_leaves_the_others_served(url):
    health = httpx.get(f"{url}/healthz").json()
    assert health["status"] == "degraded" and "maya" in health["broken"], health
    assert _search(url, "elena").status_code == 200
    r = _search(url, "maya")
    assert r.status_code == 503 and r.json()["error"] == "tenant_unavailable"
    assert "maya" in r.json()["reason"] and "\n" not in r.json()["reason"]


def test_a_corrupt_graph_is_503_with_a_reason_and_reported(url):
    r = _search(url, "raj", strategy="gaama")
    assert r.status_code == 503 and r.json()["error"] == "tenant_unavailable", r.text
    reason = r.json()["reason"]
    assert "graph" in reason and len(reason) < 400 and "\n" not in reason
    assert "raj" in httpx.get(f"{url}/healthz").json()["broken"]
    assert _search(url, "raj", strategy="bm25").status_code == 200  # what needs no graph still works


def test_inspect_names_the_broken_tenants(damaged_store):
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "inspect", "--store", str(damaged_store)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "BROKEN tenant maya" in proc.stdout and "BROKEN tenant raj" in proc.stdout
    assert "tenant elena:" in proc.stdout and "Traceback" not in proc.stderr


def test_deeply_nested_body_is_422_and_counted(url):
    before = _count(url, 422)
    depth = 2_500
    body = '{"tenant": "elena", "query": "x", "k": ' + "[" * depth + "]" * depth + "}"
    assert len(body) <= 10_240
    r = httpx.post(f"{url}/v1/search", content=body.encode(), headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"] == "malformed_body", r.text
    huge = '{"tenant": "elena", "query": "x", "k": ' + "9" * 5000 + "}"  # past Python's int conversion limit
    r = httpx.post(f"{url}/v1/search", content=huge.encode(), headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"] == "malformed_body", r.text
    assert _count(url, 422) == before + 2


def test_empty_strategy_is_refused(url):
    r = _search(url, "elena", strategy="")
    assert r.status_code == 422 and r.json()["error"] == "unknown_strategy", r.text


def test_chunked_oversize_body_is_refused_before_it_is_read(url):
    """A chunked upload (no Content-Length) is answered 422 once it passes serve.max_body_bytes, while
    the client is still sending: the service does not wait for (and buffer) the rest of the body."""
    host, port = url.removeprefix("http://").split(":")
    piece = b" " * 65_536
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST /v1/search HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {ADMIN}\r\n"
                     "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        for _ in range(16):  # 1 MiB of a body that never ends
            sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
        sock.settimeout(30)
        answer = b""
        try:
            while b"body_too_large" not in answer:
                data = sock.recv(65_536)
                if not data:
                    break
                answer += data
        except socket.timeout:
            pass
    assert answer.startswith(b"HTTP/1.1 422"), answer[:300]
    assert b"body_too_large" in answer
