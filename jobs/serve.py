"""Entrypoint of the retrieval service: the memlib FastAPI app as a Ray Serve deployment.

Each replica builds one :class:`memlib.serve.service.SearchService` (tenant tables and
graphs loaded once and cached, strategies instantiated once, manifest polling) and
hands its FastAPI app to Serve at replica start (``__serve_build_asgi_app__``).
Replicas take ``serve.replica_cpus`` CPUs each; ``serve.replicas`` of them.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

import httpx
import ray
from ray import serve

from jobs.local_ray import LocalRayEnv, free_port, serve_env, start_local, stop_local  # noqa: F401 (free_port)
from jobs.ray_logs import quiet_python_loggers
from jobs.serve_procs import Ledger, alive, end_processes, haproxies, haproxy_dir, on_parent_death, stop_stale_haproxies
from memlib.config import MemlibConfig
from memlib.serve.app import build_app
from memlib.serve.service import SearchService

APP_NAME = "memlib"
DEPLOYMENT_NAME = "MemlibSearch"


class MemlibSearch:
    """One replica: the service over ``store`` and its FastAPI app."""

    def __init__(self, store: str, cfg: MemlibConfig):
        self.service = SearchService(store, cfg).start(freeze_gc=True)

    def __serve_build_asgi_app__(self):
        return build_app(self.service)

    def __del__(self):
        service = getattr(self, "service", None)
        if service is not None:
            service.stop()


def replica_options(cfg: MemlibConfig) -> dict:
    """Actor options of a replica.

    * ``serve.blas_threads``: a query's matmuls are small, and a BLAS pool with one thread per
      core spin-waits between them: measured in-process on locomo_dev3, ``auto`` used 23-31 ms
      of CPU per query with the default pool and ~17 ms with one thread, at the same or
      better throughput under 4 concurrent requests.
    * ``serve.handlers_on_main_loop``: Serve runs user code on a second event loop thread by
      default, one more hand-off per request. memlib's handlers never block (searches go to a
      thread pool), so they can share the replica's loop: measured with ``memlib bench serve``
      on locomo_dev3 (one replica, 4 clients), auto p50/p95 21.1/32.9 -> 19.4/30.2 ms, bm25
      22.9/32.7 -> 18.5/27.0 ms; one client, auto 9.2 -> 7.4 ms."""
    opts: dict = {"num_cpus": cfg.serve.replica_cpus}
    env: dict[str, str] = {}
    if cfg.serve.blas_threads is not None:
        n = str(cfg.serve.blas_threads)
        env.update(OPENBLAS_NUM_THREADS=n, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n)
    if cfg.serve.handlers_on_main_loop:
        env["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] = "0"
    if env:
        opts["runtime_env"] = {"env_vars": env}
    return opts


def application(store: str | Path, cfg: MemlibConfig):
    """The bound Serve application (``serve.run`` target)."""
    deployment = serve.deployment(
        name=DEPLOYMENT_NAME, num_replicas=cfg.serve.replicas, max_ongoing_requests=cfg.serve.max_ongoing_requests,
        ray_actor_options=replica_options(cfg),
    )(serve.ingress()(MemlibSearch))
    return deployment.bind(str(Path(store).resolve()), cfg)


_LOCAL: list[LocalRayEnv] = []  # what this process applied when it started a local Ray for Serve
_LEDGER: list[Ledger] = []  # the processes of the local instance this process started (jobs/serve_procs.py)
_AFTER_INIT: list = []  # called once a local Ray has started (run_forever re-installs its signal handlers)


def init_ray(address: str | None = None, num_cpus: int | None = None, cfg: MemlibConfig | None = None,
             port: int | None = None, quiet: bool = False) -> None:
    """Join ``address`` (or RAY_ADDRESS), or start a local instance bound and guarded as
    :mod:`jobs.local_ray` describes (free ports, loopback HAProxy side ports, token auth); its
    HAProxy keeps its files under :func:`jobs.serve_procs.haproxy_dir` of ``port``. ``quiet``:
    Ray's and Serve's INFO lines hidden (:mod:`jobs.ray_logs`)."""
    cfg = cfg or MemlibConfig()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    address = address or os.environ.get("RAY_ADDRESS")
    if ray.is_initialized():
        return
    if address:
        if cfg.serve.haproxy_ingress:  # read by the Serve controller and proxies of the cluster
            os.environ.setdefault("RAY_SERVE_ENABLE_HA_PROXY", "1")
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING if quiet else logging.INFO)
        if quiet:
            quiet_python_loggers()
        return
    directory = haproxy_dir(port if port is not None else cfg.serve.port)
    if cfg.serve.haproxy_ingress:
        stop_stale_haproxies(port if port is not None else cfg.serve.port, directory, _say)
    _LEDGER.append(Ledger(haproxy_dir=directory).start())
    _LOCAL.append(start_local(num_cpus, token_auth=cfg.ray.local_token_auth,
                              serve=serve_env(cfg.serve.haproxy_ingress, directory, cfg.serve.body_timeout_s),
                              quiet=quiet))
    if quiet:
        quiet_python_loggers()
    for hook in _AFTER_INIT:  # ray.init replaced the SIGTERM handler (Python's, and a C one printing a stack)
        hook()


def _say(line: str) -> None:
    print(line, flush=True)


def wait_healthy(base_url: str, timeout_s: float = 300.0) -> dict:
    """Poll ``/healthz`` until the app answers (replica start loads tenants and models)."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            resp = httpx.get(f"{base_url}/healthz", timeout=5.0)
            if resp.status_code == 200:
                return resp.json()
            last = RuntimeError(f"/healthz answered {resp.status_code}")
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.5)
    raise TimeoutError(f"memlib service at {base_url} not healthy after {timeout_s:.0f}s: {last}")


def start(store: str | Path, cfg: MemlibConfig, *, host: str | None = None, port: int | None = None,
          address: str | None = None, num_cpus: int | None = None, timeout_s: float = 300.0,
          quiet: bool = False) -> str:
    """Start Ray (local by default), Serve's HTTP proxy and the app; returns the base URL once healthy.
    ``quiet``: Ray's and Serve's own INFO lines hidden (``memlib serve`` without --verbose)."""
    host = host or cfg.serve.host
    port = port if port is not None else cfg.serve.port
    init_ray(address or cfg.ray.address, num_cpus or cfg.ray.num_cpus, cfg, port=port, quiet=quiet)
    serve.start(http_options={"host": host, "port": port})
    serve.run(application(store, cfg), name=APP_NAME, route_prefix="/", blocking=False)
    base_url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    wait_healthy(base_url, timeout_s)
    return base_url


DRAIN_S = 2.0  # requests in flight when a local service stops get this long to finish
# then its processes get SIGTERM and this long before SIGKILL: Ray's actors and its autoscaler
# monitor outlive a SIGTERM by seconds once their raylet or GCS is gone (measured: 3 s was not enough)
KILL_AFTER_S = 1.0


def stop(exiting: bool = False) -> int:
    """Stop the service; returns how many of its processes were ended. ``exiting``: this process
    ends right after (``memlib serve``), so its Ray driver need not disconnect first: Ray's
    shutdown gives each head process a second and waits for a GCS a signal to the group may have
    ended already (7 s measured), and its exit hook must then be skipped (``os._exit``).

    A local instance this process started is stopped whole, without Serve's controller shutdown
    (which waits up to 30 s for the controller, then kills it and prints the failed task): its
    HAProxy processes are asked to stop accepting and finish the requests in flight (SIGUSR1,
    :data:`DRAIN_S`), Ray is shut down, and every process recorded while the service ran that is
    still alive (actors, HAProxy re-parented to PID 1, the head when its group was signalled) is
    ended. On a cluster joined by address, Serve is shut down and the cluster left running."""
    ledger = _LEDGER.pop() if _LEDGER else None
    if ledger is None:
        try:
            serve.shutdown()
        finally:
            if ray.is_initialized():
                ray.shutdown()
        return 0
    seen = ledger.close()
    mine = [key for key in seen if key[0] != os.getpid()]
    running = alive(mine)
    try:
        end_processes(haproxies(mine, seen), grace_s=DRAIN_S, first=signal.SIGUSR1)
        if not exiting:
            stop_local()
    finally:
        if not exiting and ray.is_initialized():
            ray.shutdown()
        end_processes(mine, grace_s=KILL_AFTER_S)
        _cleanup(ledger)
    return len(running) - len(alive(mine))


def _cleanup(ledger: Ledger) -> None:
    if ledger.haproxy_dir:
        shutil.rmtree(ledger.haproxy_dir, ignore_errors=True)
    while _LOCAL:
        wrapper = _LOCAL.pop().wrapper_dir
        if wrapper is not None:
            shutil.rmtree(wrapper, ignore_errors=True)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Stopped(BaseException):
    """A stop signal arrived while the service was starting."""


def run_forever(store: str | Path, cfg: MemlibConfig, **kwargs) -> None:
    """``memlib serve``: start, block until SIGINT, SIGTERM or SIGHUP (to the process or its group)
    or the death of the parent process, then stop every process the service started (:func:`stop`)."""
    stopping = threading.Event()
    state = {"started": False}

    def on_signal(signum, frame) -> None:
        if stopping.is_set():
            return
        stopping.set()
        if not state["started"]:
            raise _Stopped(signum)

    def arm() -> None:  # also after ray.init, which installs its own SIGTERM handler
        for sig in STOP_SIGNALS:
            signal.signal(sig, on_signal)

    arm()
    _AFTER_INIT.append(arm)
    on_parent_death(lambda: os.kill(os.getpid(), signal.SIGTERM))
    code = 0
    try:
        base_url = start(store, cfg, **kwargs)
        arm()
        state["started"] = True
        if not stopping.is_set():
            print(f"memlib service on {base_url}  (OpenAPI: {base_url}/openapi.json; Ctrl-C, SIGTERM or SIGHUP "
                  "stops it)", flush=True)
            print(f"memory explorer: {base_url}/ui/", flush=True)
        while not stopping.wait(1.0):
            pass
    except (_Stopped, KeyboardInterrupt, SystemExit):
        pass
    except Exception:  # noqa: BLE001 - a failed start still ends what it started, then says why
        traceback.print_exc()
        code = 1
    finally:
        stopping.set()
        for sig in STOP_SIGNALS:  # a second signal must not interrupt the stop
            signal.signal(sig, signal.SIG_IGN)
        _AFTER_INIT.clear()
        ended = stop(exiting=True)
        print(f"memlib serve: stopped; {ended} processes ended", flush=True)
        sys.stderr.flush()
        # nothing is left to clean up: leave before Ray's exit hook, which would wait for a GCS the
        # signal to the group may have ended
        os._exit(code)
