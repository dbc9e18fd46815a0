"""Two `memlib serve` processes on one machine, each starting its own local Ray:
both start; HAProxy's frontend, stats page and Prometheus endpoint listen on loopback only, on
ports of their own; no process of either service takes Ray's or Serve's fixed default ports; and
Ray's control plane, which Ray 2.60 binds to every interface, refuses a client without the
instance's token."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from jobs.serve import free_port
from tests.serve.conftest import write_version

pytestmark = pytest.mark.ray
# HAProxy stats and metrics, Serve's fallback proxy (HTTP, gRPC), Ray's dashboard and autoscaler metrics
FIXED_DEFAULTS = {8404, 9101, 8500, 9500, 44217, 44227}
LOOPBACK = {"127.0.0.1", "::1"}


def _spawn(store: Path, port: int, log: Path, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "jobs.cli", "serve", "--store", str(store), "--port", str(port),
                                 "--set", "serve.preload_tenants=1", *extra],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 400.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"service exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            r = httpx.get(f"{url}/healthz", timeout=5.0)
            if r.status_code == 200:
                return r.json()
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    pytest.fail(f"service at {url} not healthy after {timeout_s:.0f}s:\n{log.read_text(errors='replace')[-3000:]}")


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _listeners(pid: int) -> list[tuple[str, str, int]]:
    """(process name, ip, port) of every listening TCP socket of the process tree."""
    out = set()
    for p in _tree(pid):
        try:
            out |= {(p.name(), c.laddr.ip, c.laddr.port) for c in p.net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            continue
    return sorted(out)


def _settled_listeners(pid: int, port: int, timeout_s: float = 90.0) -> list[tuple[str, str, int]]:
    """The listeners once HAProxy holds the service port: while replicas come up, HAProxy reloads
    (a new process takes the sockets over from the old one), so a snapshot can fall between them."""
    deadline = time.monotonic() + timeout_s
    while True:
        listening = _listeners(pid)
        if any(x[0] == "haproxy" and x[2] == port for x in listening) or time.monotonic() > deadline:
            return listening
        time.sleep(1.0)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _refuses_without_token(gcs_port: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["RAY_AUTH_MODE"] = "disabled"
    code = f"import ray; ray.init(address='127.0.0.1:{gcs_port}'); print('CONNECTED')"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)


def test_two_services_on_one_machine_bind_loopback_and_free_ports(tmp_path, embedder):
    store = tmp_path / "store"
    write_version(store, embedder)
    ports = [free_port(), free_port()]
    logs = [tmp_path / "serve-a.log", tmp_path / "serve-b.log"]
    procs = [_spawn(store, ports[0], logs[0])]
    haproxies: list[psutil.Process] = []
    try:
        _wait_healthy(f"http://127.0.0.1:{ports[0]}", procs[0], logs[0])
        procs.append(_spawn(store, ports[1], logs[1]))
        _wait_healthy(f"http://127.0.0.1:{ports[1]}", procs[1], logs[1])
        per_service = [_settled_listeners(p.pid, port) for p, port in zip(procs, ports)]
        haproxies = [x for p in procs for x in _tree(p.pid) if x.name() == "haproxy"]
        for listening, port in zip(per_service, ports):
            haproxy = [x for x in listening if x[0] == "haproxy"]
            assert any(x[2] == port for x in haproxy), listening
            assert len({x[2] for x in haproxy}) >= 3, "frontend, stats and metrics"
            assert all(x[1] in LOOPBACK for x in haproxy), haproxy
            assert not [x for x in listening if x[2] in FIXED_DEFAULTS], listening
            assert not [x for x in listening if x[0] != "haproxy" and x[2] == port], listening
        stats = [{x[2] for x in listening if x[0] == "haproxy"} for listening in per_service]
        assert not stats[0] & stats[1], "each service has HAProxy ports of its own"
        gcs_port = next(x[2] for x in per_service[0] if x[0] == "gcs_server")
        proc = _refuses_without_token(gcs_port)
        assert proc.returncode != 0 and "CONNECTED" not in proc.stdout, proc.stdout[-500:]
        assert "token" in proc.stderr.lower(), proc.stderr[-1500:]
    finally:
        for p in procs:
            _stop(p)
    _, alive = psutil.wait_procs(haproxies, timeout=30)
    assert not alive, f"HAProxy outlived its service: {alive}"


def test_a_local_service_drains_its_replicas_briefly(monkeypatch):
    """Ray keeps a replica behind HAProxy reachable 30 s before it stops (for a cluster's load
    balancers); a local instance's HAProxy is its own, so `memlib serve` asks for 1 s: it used to
    take 35 s to exit on SIGTERM ("Controller failed to shut down within 30.0s"). A value the user
    set is kept, and a service without HAProxy sets nothing."""
    from jobs.local_ray import LOCAL_DRAINING_PERIOD_S, serve_env

    var = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"
    monkeypatch.delenv(var, raising=False)
    envs = [serve_env(True), serve_env(False)]
    monkeypatch.setenv(var, "12")
    envs.append(serve_env(True))
    for e in envs:  # HAProxy's wrapper script, when this machine has HAProxy
        if e.wrapper_dir is not None:
            shutil.rmtree(e.wrapper_dir)
    assert float(envs[0].env[var]) == LOCAL_DRAINING_PERIOD_S < 30
    assert var not in envs[1].env
    assert envs[2].env[var] == "12"
