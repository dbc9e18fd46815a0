"""Entrypoint of the retrieval service: the memlib FastAPI app as a Ray Serve deployment.

Each replica builds one :class:`memlib.serve.service.SearchService` (tenant tables and
graphs loaded once and cached, strategies instantiated once, manifest polling) and
hands its FastAPI app to Serve at replica start (``__serve_build_asgi_app__``).
Replicas take ``serve.replica_cpus`` CPUs each; ``serve.replicas`` of them.
"""
from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import ray
from ray import serve

from jobs.local_ray import LocalRayEnv, free_port, serve_env, start_local  # noqa: F401 (free_port: callers)
from memlib.config import MemlibConfig
from memlib.serve.app import build_app
from memlib.serve.service import SearchService

APP_NAME = "memlib"
DEPLOYMENT_NAME = "MemlibSearch"


class MemlibSearch:
    """One replica: the service over ``store`` and its FastAPI app."""

    def __init__(self, store: str, cfg: MemlibConfig):
        self.service = SearchService(store, cfg).start()

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


def init_ray(address: str | None = None, num_cpus: int | None = None, cfg: MemlibConfig | None = None) -> None:
    """Join ``address`` (or RAY_ADDRESS), or start a local instance bound and guarded as
    :mod:`jobs.local_ray` describes (free ports, loopback HAProxy side ports, token auth)."""
    cfg = cfg or MemlibConfig()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    address = address or os.environ.get("RAY_ADDRESS")
    if ray.is_initialized():
        return
    if address:
        if cfg.serve.haproxy_ingress:  # read by the Serve controller and proxies of the cluster
            os.environ.setdefault("RAY_SERVE_ENABLE_HA_PROXY", "1")
        ray.init(address=address, log_to_driver=False)
    else:
        _LOCAL.append(start_local(num_cpus, token_auth=cfg.ray.local_token_auth,
                                  serve=serve_env(cfg.serve.haproxy_ingress)))


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
          address: str | None = None, num_cpus: int | None = None, timeout_s: float = 300.0) -> str:
    """Start Ray (local by default), Serve's HTTP proxy and the app; returns the base URL once healthy."""
    host = host or cfg.serve.host
    port = port if port is not None else cfg.serve.port
    init_ray(address or cfg.ray.address, num_cpus or cfg.ray.num_cpus, cfg)
    serve.start(http_options={"host": host, "port": port})
    serve.run(application(store, cfg), name=APP_NAME, route_prefix="/", blocking=False)
    base_url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    wait_healthy(base_url, timeout_s)
    return base_url


def stop() -> None:
    """Shut down Serve and the Ray instance this process started, and the HAProxy processes of that
    instance: one spawned by a reload while Serve shuts down outlives its manager actor (it is not
    in Ray's process group) and would keep the service's ports."""
    node = ray.get_runtime_context().get_node_id() if _LOCAL and ray.is_initialized() else None
    try:
        serve.shutdown()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if node is not None:
            _end_haproxies(node)
        while _LOCAL:
            wrapper = _LOCAL.pop().wrapper_dir
            if wrapper is not None:
                shutil.rmtree(wrapper, ignore_errors=True)


def _end_haproxies(node_id: str, timeout_s: float = 10.0) -> None:
    """Terminate the HAProxy processes whose config lives under this node's directory."""
    import psutil

    mine = [p for p in psutil.process_iter(["name", "cmdline"])
            if p.info["name"] == "haproxy" and any(node_id in arg for arg in p.info["cmdline"] or [])]
    for p in mine:
        try:
            p.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(mine, timeout=timeout_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            continue


def run_forever(store: str | Path, cfg: MemlibConfig, **kwargs) -> None:
    """``memlib serve``: start and block until interrupted."""
    base_url = start(store, cfg, **kwargs)
    print(f"memlib service on {base_url}  (OpenAPI: {base_url}/openapi.json; Ctrl-C stops)", flush=True)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        stop()


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)
