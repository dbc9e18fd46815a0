"""The processes a ``memlib serve`` owns: recorded while it runs, ended when it stops, and stale ones of an earlier run.

Ray starts its head (GCS, raylet, agents) as children of the ``memlib serve`` process and its
actors (Serve controller, proxies, replicas) as children of the raylet, each actor in a process
group of its own; Serve's HAProxy manager actor starts HAProxy, and starts a new HAProxy for
every reload (``-sf``), the old one draining its connections for up to two minutes. A signal to
the service's process group therefore reaches Ray's head but neither the actors nor HAProxy, and
an HAProxy whose manager died is re-parented to PID 1 and never stopped by Ray.

So the service records what it started (:class:`Ledger`: every descendant of its process, and
every HAProxy whose command line names this service's HAProxy directory, wherever it was
re-parented), and ends each of them when it stops (:func:`end_processes`), checking each
process's start time so a reused PID is never signalled.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Callable, Iterable

import psutil

PR_SET_PDEATHSIG = 1
Key = tuple[int, float]  # (pid, create_time): a process, not a reusable number


def haproxy_dir(port: int) -> Path:
    """Where Serve's HAProxy of a local service on ``port`` keeps its config, sockets and state
    (Ray adds a directory per node). One per port, so an HAProxy left by an earlier run on the
    same port is recognized by its command line. Short, in /tmp like Ray's default: HAProxy
    refuses a socket path longer than 97 bytes, and Ray adds a 56-character node id."""
    return Path("/tmp") / f"memlib-haproxy-{port}"


def _is_haproxy(info: dict) -> bool:
    cmd = info.get("cmdline") or []
    return info.get("name") == "haproxy" or bool(cmd and os.path.basename(cmd[0]) == "haproxy")


def _names(info: dict, directory: str) -> bool:
    """Whether a command line names a file under ``directory`` (port 1843's is not port 18436's)."""
    inside = directory.rstrip("/") + "/"
    return any(inside in arg for arg in info.get("cmdline") or [])


class Ledger:
    """Every process of the service seen while it runs: descendants of ``root`` and the HAProxy
    processes whose command line names ``haproxy_dir`` (polled every ``interval_s`` in a thread)."""

    def __init__(self, root: int | None = None, haproxy_dir: Path | None = None, interval_s: float = 1.0):
        self.root = root or os.getpid()
        self.haproxy_dir = str(haproxy_dir) if haproxy_dir is not None else None
        self.interval_s = interval_s
        self.seen: dict[Key, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Ledger":
        self.sweep()
        self._thread = threading.Thread(target=self._run, name="memlib-serve-ledger", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sweep()

    def sweep(self) -> dict[Key, str]:
        """Record the service's processes alive now; returns them."""
        infos = []
        for p in psutil.process_iter(["pid", "ppid", "name", "cmdline", "create_time"]):
            infos.append(p.info)
        children: dict[int, list[dict]] = {}
        for info in infos:
            children.setdefault(info["ppid"], []).append(info)
        now: dict[Key, str] = {}
        todo = list(children.get(self.root, []))
        while todo:
            info = todo.pop()
            now[(info["pid"], info["create_time"])] = info["name"] or "?"
            todo.extend(children.get(info["pid"], []))
        if self.haproxy_dir:
            for info in infos:
                if _is_haproxy(info) and _names(info, self.haproxy_dir):
                    now[(info["pid"], info["create_time"])] = "haproxy"
        with self._lock:
            self.seen.update(now)
        return now

    def close(self) -> dict[Key, str]:
        """Stop polling; one last sweep; every process recorded."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sweep()
        with self._lock:
            return dict(self.seen)


def alive(keys: Iterable[Key]) -> list[psutil.Process]:
    out = []
    for pid, created in keys:
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 0.01 and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def _signal_all(procs: list[psutil.Process], sig: int) -> None:
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            continue


def end_processes(keys: Iterable[Key], grace_s: float = 3.0, first: int = signal.SIGTERM) -> int:
    """Signal each recorded process still alive (``first``, then SIGKILL after ``grace_s``) and
    wait for it; returns how many were alive. Zombies of this process are reaped by psutil."""
    procs = [p for p in alive(keys) if p.pid != os.getpid()]
    _signal_all(procs, first)
    _, left = psutil.wait_procs(procs, timeout=grace_s)
    _signal_all(left, signal.SIGKILL)
    psutil.wait_procs(left, timeout=5)
    return len(procs)


def haproxies(keys: Iterable[Key], names: dict[Key, str]) -> list[Key]:
    return [k for k in keys if names.get(k) == "haproxy"]


def _listens_on(p: psutil.Process, port: int) -> bool:
    try:
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in p.net_connections(kind="inet"))
    except psutil.Error:
        return False


def _orphaned(info: dict) -> bool:
    """An HAProxy whose Serve manager actor (a ``ray::`` worker) is gone."""
    try:
        parent = psutil.Process(info["ppid"])
        cmd = parent.cmdline()
    except psutil.Error:
        return True
    return not (cmd and cmd[0].startswith("ray::"))


def stale_haproxies(port: int, directory: Path) -> list[psutil.Process]:
    """HAProxy processes no Serve manager owns any more that hold ``port`` or name ``directory``
    (a previous run's on this port); an HAProxy of a live service is never one of them."""
    found = []
    for p in psutil.process_iter(["pid", "ppid", "name", "cmdline"]):
        info = p.info
        if p.pid == os.getpid() or not _is_haproxy(info) or not _orphaned(info):
            continue
        if _names(info, str(directory)) or _listens_on(p, port):
            found.append(p)
    return found


def stop_stale_haproxies(port: int, directory: Path, say: Callable[[str], None]) -> list[int]:
    """End :func:`stale_haproxies`; one line through ``say`` when there were any."""
    stale = stale_haproxies(port, directory)
    if not stale:
        return []
    pids = sorted(p.pid for p in stale)
    end_processes([(p.pid, p.create_time()) for p in stale], grace_s=5.0)
    say(f"memlib serve: stopped {len(pids)} stale HAProxy process(es) of an earlier run on port {port} "
        f"(pid {', '.join(map(str, pids))})")
    return pids


def on_parent_death(callback: Callable[[], None], interval_s: float = 1.0) -> None:
    """Call ``callback`` once when this process's parent dies: the kernel sends SIGTERM then
    (``PR_SET_PDEATHSIG``, Linux), and a thread polling ``getppid`` covers the other cases (the
    parent thread that started us exiting first, other systems). Nothing is watched when the
    parent is already gone (a service detached with ``setsid -f`` or a daemonizer)."""
    parent = os.getppid()
    if parent == 1:
        return
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # died before the request took effect
        callback()
        return

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(interval_s)
        callback()

    threading.Thread(target=watch, name="memlib-serve-parent", daemon=True).start()
