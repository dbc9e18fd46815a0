"""``memlib serve``: the multi-tenant retrieval service on Ray Serve, and ``memlib serve
hash-token`` to produce the sha256 digest a config stores instead of a token."""
from __future__ import annotations

import errno
import os
import socket
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from jobs.cli.common import DEFAULTS, ConfigOpt, SetOpt, default_note, fail, get_config

serve_app = typer.Typer(help="""Serve retrieval over HTTP (Ray Serve, FastAPI ingress).

Stop it with Ctrl-C, SIGTERM or SIGHUP, to its PID or to its process group; it also stops when its parent
process dies (detach it with `setsid -f` or a service manager, not nohup). Every process it started (the
local Ray, Serve's actors, HAProxy, reloaded ones included) is ended within 15 s, and it prints
"stopped; N processes ended". An HAProxy that an earlier run left on the port is stopped at start.""")


@serve_app.callback(invoke_without_command=True)
def serve_cmd(
    ctx: typer.Context,
    store: Annotated[Optional[Path], typer.Option("--store", "-s", help="memory store directory")] = None,
    host: Annotated[Optional[str], typer.Option(
        "--host", help=f"bind address; {default_note('serve.host', DEFAULTS.serve.host)}")] = None,
    port: Annotated[Optional[int], typer.Option(
        "--port", help=f"port; {default_note('serve.port', DEFAULTS.serve.port)}")] = None,
    address: Annotated[Optional[str], typer.Option("--address", help="Ray cluster address (default: local)")]
    = None,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    open_local: Annotated[bool, typer.Option("--open-local", help="no tokens, for one person on their own "
                                             "machine: listens on loopback only (refused with another --host "
                                             "or a cluster)")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Ray's and Serve's own log lines "
                                          "(hidden by default)")] = False,
) -> None:
    """Start the service: POST /v1/search, GET /v1/tenants, GET /healthz, GET /metrics, POST /v1/reload,
    the MCP server at /mcp, the memory explorer at /ui, OpenAPI at /openapi.json (/docs with
    serve.api_docs).

    Stop it with Ctrl-C, SIGTERM or SIGHUP (to its PID or its process group); it also stops when its
    parent process dies (detach with `setsid -f`). Every process it started (local Ray, Serve actors,
    HAProxy, reloaded ones included) is ended within 15 s, then it prints "stopped; N processes ended".
    An HAProxy an earlier run left on the port is stopped at start."""
    if ctx.invoked_subcommand is not None:
        return
    if store is None:
        fail("--store is required")
        return
    from memlib.io.store import StoreError, read_manifest

    try:
        manifest = read_manifest(store)
    except StoreError as exc:
        fail(str(exc))
        return
    if manifest is None:
        fail(f"{store} is not a memlib store (no manifest.json); run `memlib build` first")
    cfg = get_config(config, overrides)
    if open_local:
        cfg = open_local_config(cfg, host, address or cfg.ray.address or os.environ.get("RAY_ADDRESS"))
    if port is not None and not 1 <= port <= 65535:
        fail(f"--port {port}: a TCP port is 1-65535")
    from memlib.embed.base import EmbedError
    from memlib.embed.space import store_embed_config

    try:  # the queries are embedded as the store's nodes were: a contradicting config stops here
        store_embed_config(cfg.embed, manifest, str(store))
    except EmbedError as exc:
        fail(str(exc))
    if not cfg.serve.auth_enabled and not is_loopback(host or cfg.serve.host):
        typer.secho(f"warning: auth is disabled and the service listens on {host or cfg.serve.host}: anyone who "
                    "reaches it reads every tenant", fg=typer.colors.YELLOW, err=True)
    elif cfg.serve.auth_enabled and not (cfg.serve.admin_token_hash or cfg.serve.tenant_token_hashes):
        typer.secho("warning: auth is enabled but no token hashes are configured: every request gets 401. "
                    "Set serve.admin_token_hash (see `memlib serve hash-token`).", fg=typer.colors.YELLOW, err=True)
    if not (address or cfg.ray.address or os.environ.get("RAY_ADDRESS")):  # a local service binds here
        bind = port if port is not None else cfg.serve.port
        if cfg.serve.haproxy_ingress:  # an HAProxy an earlier run left on the port is ours to stop, not a conflict
            from jobs.serve_procs import haproxy_dir, stop_stale_haproxies

            stopped = stop_stale_haproxies(bind, haproxy_dir(bind), lambda line: print(line, flush=True))
        else:
            stopped = []
        problem = port_problem(host or cfg.serve.host, bind)
        deadline = time.monotonic() + 5.0
        while problem and stopped and time.monotonic() < deadline:  # a stopped HAProxy's listener, closing
            time.sleep(0.1)
            problem = port_problem(host or cfg.serve.host, bind)
        if problem:
            fail(problem)
    from jobs.ray_logs import ray_logs_wanted
    from jobs.serve import run_forever

    if open_local:
        typer.echo(f"open-local: no tokens; only this machine can connect ({cfg.serve.host})")
    run_forever(store, cfg, host=host, port=port, address=address, quiet=not ray_logs_wanted(verbose))


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def open_local_config(cfg, host: Optional[str], address: Optional[str]):
    """``--open-local``: the config with auth off and the service on loopback; refused (exit 2) for
    another host or a cluster, where a service without tokens would be open to others."""
    if address:
        fail(f"--open-local serves without tokens on this machine only, not on a Ray cluster ({address}); "
             "drop --address / RAY_ADDRESS, or keep tokens (`memlib serve hash-token`)")
    bind = host or "127.0.0.1"
    if not is_loopback(bind):
        fail(f"--open-local serves without tokens, so only on loopback: --host {bind} is reachable from other "
             "machines; use --host 127.0.0.1, or keep tokens (`memlib serve hash-token`)")
    return cfg.model_copy(update={"serve": cfg.serve.model_copy(update={"auth_enabled": False, "host": bind})})


def port_problem(host: str, port: int) -> str | None:
    """Why the service could not listen on ``host:port`` (in use, or an address not of this machine),
    found before Ray starts: Serve would fail 20 s later with a long traceback."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"--host {host}: cannot resolve it ({exc.strerror})"
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP proxy does: TIME_WAIT is no conflict
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return (f"port {port} on {host} is already in use (another service is listening there): "
                        "stop it or choose another with --port")
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None


@serve_app.command("hash-token")
def hash_token_cmd(
    token: Annotated[Optional[str], typer.Argument(help="token to hash; '-' reads stdin; omit for a new one")]
    = None,
) -> None:
    """Print the sha256 digest to put in serve.tenant_token_hashes / serve.admin_token_hash."""
    from memlib.serve.auth import hash_token, new_token

    if token == "-":
        token = sys.stdin.readline().strip()
    if token is None:
        token = new_token()
        typer.echo(f"token:  {token}")
        typer.echo(f"sha256: {hash_token(token)}")
        return
    if not token:
        fail("empty token")
    typer.echo(hash_token(token))


def register(app: typer.Typer) -> None:
    app.add_typer(serve_app, name="serve")
