"""``memlib bench serve``: a bounded loopback load against the real Ray Serve service.

Starts the service on a free loopback port with a fresh admin token, draws questions from
the store's ``questions`` table (turn texts when a store has none), warms each strategy with
one question of every tenant plus a few more (untimed, reported as ``warmup_s``), sends
``--requests`` requests per strategy from ``--concurrency`` client threads, and prints one
JSON line: ``{"strategies": {NAME: {"p50_ms", "p95_ms", "p99_ms", "qps", "requests",
"warmup_s", "mcp_wire": {...}, "mcp": {...}, "mcp_wire_added_p50_ms", "mcp_added_p50_ms"}},
"errors": N}``. Latency is client-side (HTTP round trip through the Serve proxy). With
``--mcp`` (the default) the same requests are also sent as MCP ``search_memory`` calls to
``/mcp``, as plain HTTP requests of the MCP wire protocol (``mcp_wire``: what the service's
MCP layer adds) and through the official SDK's client (``mcp``: plus the client's own cost),
in rounds that rotate the three arms. The load generator is :mod:`jobs.bench.serve_load`; this
module only parses, starts the service and prints."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from jobs.cli.common import DEFAULTS, ConfigOpt, SetOpt, default_note, fail, get_config


def register(bench_app: typer.Typer) -> None:
    @bench_app.command("serve")
    def bench_serve(
        store: Annotated[Path, typer.Option("--store", "-s", help="memory store directory")],
        requests: Annotated[int, typer.Option("--requests", help="requests per strategy (>= 1)")] = 2000,
        concurrency: Annotated[int, typer.Option("--concurrency", help="concurrent client threads")] = 4,
        strategies: Annotated[str, typer.Option("--strategies", help="comma-separated")] = "auto,bm25,dense,hybrid",
        k: Annotated[int, typer.Option("--k", help="k of every request")] = 10,
        max_seconds: Annotated[float, typer.Option("--max-seconds", help="time bound per strategy")] = 600.0,
        replicas: Annotated[Optional[int], typer.Option(
            "--replicas", help=default_note("serve.replicas", DEFAULTS.serve.replicas))] = None,
        mcp: Annotated[bool, typer.Option("--mcp/--no-mcp", help="also send every request as an MCP search_memory "
                                          "call (official SDK client, /mcp) and report both")] = True,
        zipf: Annotated[Optional[float], typer.Option("--zipf", help="many tenants: requests spread over the "
                                                      "store's tenants by a Zipf law of this exponent (e.g. 1.1), "
                                                      "in process, a cache holding --cache-share of them")] = None,
        cache_share: Annotated[float, typer.Option("--cache-share", help="with --zipf: share of the tenants the "
                                                   "cache holds")] = 0.05,
        warm: Annotated[Optional[int], typer.Option("--warm", help="with --zipf: untimed requests first (default: "
                                                    "--requests)")] = None,
        publish_input: Annotated[Optional[Path], typer.Option("--publish-input", help="with --zipf: a nightly "
                                                              "input built into the store (--incremental) during "
                                                              "the load; figures of the minute before and after "
                                                              "its version is served")] = None,
        publish_after: Annotated[float, typer.Option("--publish-after", help="seconds of timed load before the "
                                                     "nightly run starts")] = 60.0,
        cold: Annotated[Optional[int], typer.Option("--cold", help="every request cold: ROUNDS over the store's "
                                                    "tenants in turn, a cache of one tenant, one client, in process; "
                                                    "each first query paired with a warm second one")] = None,
        http: Annotated[bool, typer.Option("--http/--in-process", help="with --zipf: through the Ray Serve "
                                           "service (one replica) instead of in process")] = False,
        config: ConfigOpt = None,
        overrides: SetOpt = None,
    ) -> None:
        """Loopback load against `memlib serve`; prints one JSON line of latency figures."""
        from jobs.bench.serve_load import load_questions, measure
        from memlib.retrieve.registry import parse_strategies
        from memlib.serve.auth import hash_token, new_token

        cfg = get_config(config, overrides)
        try:
            names = parse_strategies(strategies)
        except KeyError as exc:
            fail(str(exc))
            return
        if cold is not None:
            from jobs.bench.serve_tenants import cold_round_robin

            try:
                typer.echo(json.dumps(cold_round_robin(store, cfg, names, max(1, cold), k)))
            except ValueError as exc:
                fail(str(exc))
            return
        if zipf is not None:
            _many_tenants(store, cfg, names, requests, concurrency, zipf, cache_share, k, warm, publish_input,
                          publish_after, max_seconds, http)
            return
        questions = load_questions(store)
        if not questions or requests < 1 or concurrency < 1:
            fail("need a store with questions or turns, --requests >= 1 and --concurrency >= 1")
        token = new_token()
        cfg.serve.admin_token_hash = hash_token(token)
        cfg.serve.auth_enabled = True
        if replicas is not None:
            cfg.serve.replicas = replicas
        from jobs.serve import free_port, start, stop

        base_url = start(store, cfg, host="127.0.0.1", port=free_port())
        result: dict = {"strategies": {}, "errors": 0, "concurrency": concurrency, "replicas": cfg.serve.replicas,
                        "questions": len(questions), "store": str(store)}
        samples: list[str] = []
        try:
            for name in names:
                figures, errors = measure(base_url, token, name, questions, requests, concurrency, k,
                                          max_seconds, mcp)
                result["strategies"][name] = figures
                result["errors"] += len(errors)
                samples.extend(errors[:3])
        finally:
            stop()
        if samples:
            result["error_samples"] = samples[:5]
        typer.echo(json.dumps(result))
        if result["errors"]:
            raise typer.Exit(1)


def _many_tenants(store: Path, cfg, names: list[str], requests: int, clients: int, exponent: float, share: float,
                  k: int, warm: Optional[int], publish_input: Optional[Path], publish_after: float,
                  max_seconds: float, http: bool) -> None:
    """``--zipf``: the many-tenant load, in process or through Serve (jobs/bench/serve_tenants.py)."""
    import tempfile

    from jobs.bench.serve_tenants import (
        InProcess,
        OverHttp,
        cache_tenants_for,
        nightly_publisher,
        run,
        tenant_queries,
    )

    queries = tenant_queries(store)
    if not queries or requests < 1 or clients < 1:
        fail("need a store with questions or turns, --requests >= 1 and --concurrency >= 1")
    cfg.serve.cache_tenants = cache_tenants_for(share, len(queries))
    cfg.serve.poll_interval_s = 1.0
    cfg.serve.preload_tenants = 0
    log_dir = Path(tempfile.mkdtemp(prefix="memlib-serve-bench-"))
    publish = nightly_publisher(store, publish_input, log_dir / "nightly.log") if publish_input else None
    if http:
        from jobs.serve import free_port, start
        from memlib.serve.auth import hash_token, new_token

        token = new_token()
        cfg.serve.admin_token_hash = hash_token(token)
        cfg.serve.replicas = 1
        client = OverHttp(start(store, cfg, host="127.0.0.1", port=free_port()), token)
    else:
        cfg.serve.auth_enabled = False
        client = InProcess(store, cfg)
    try:
        out = run(client, queries, names, requests, clients, exponent, k, requests if warm is None else warm,
                  publish, publish_after, max_seconds)
    finally:
        client.close()
    typer.echo(json.dumps({"tenants": len(queries), "zipf": exponent, "cache_share": share,
                           "cache_tenants": cfg.serve.cache_tenants, "clients": clients, "in_process": not http,
                           **out, **({"nightly_log": str(log_dir / "nightly.log")} if publish else {})}))
