"""``memlib bench scale``: build a LongMemEval-l-sized haystack (or many LoCoMo-sized tenants)
composed by :mod:`memlib.scale.haystack` and measure it.

Prints one JSON line: build_s, peak_rss_mb (driver + Ray processes), turns, turns_per_s,
nodes, edges, the filler's provenance (``filler_file``: distractor sessions from the original
LongMemEval-S dev haystacks plus the other LoCoMo conversations; ``filler_repeated_copies``:
copies of a source already copied), and for every strategy of ``--strategies`` (default: the
configured default strategy) in ``by_strategy``: haystack_turn_recall@10,
conversation_turn_recall@10 (the same LoCoMo questions against the conversation alone, built as
a separate store), recall_ratio, in-process p50/p95 on the haystack and on the conversation
alone, and p50_ratio (same run); the first strategy's figures are repeated at the top level.
``paired_p50_ratio`` (first strategy; also for each ``--also-store``) times the same questions on
both tenants interleaved in blocks of 10 (:func:`paired_latency`), free of the machine's drift
between the two sequential evaluations that ``p50_ratio`` comes from.
``--store`` / ``--alone-store`` keep the built stores and reuse them on the next run;
``--also-store`` evaluates further haystack stores (other sizes) in the same run.
p50_ms / p95_ms are those of
``POST /v1/search`` on the big tenant (first strategy) through the real service (Ray Serve HTTP proxy started
by :mod:`jobs.serve`, requests by :class:`memlib.client.MemlibClient` with a tenant token made
for the run); ``inprocess_p50_ms`` / ``inprocess_p95_ms`` are the same searches without HTTP
(TenantCache + strategy, query embedding excluded). ``--no-http`` keeps only the in-process
figures. The haystack run then builds the tenant twice more in child processes, on one core and
on every core: tenant_speedup = one-core wall / all-core wall (same run). The corpus is written
to a temporary directory, never into the repository.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from jobs.cli.common import ConfigOpt, SetOpt, get_config

if TYPE_CHECKING:  # polars is imported where it is used: not by every memlib process
    import polars as pl


class TenantSize(str, Enum):
    LOCOMO = "locomo"


# distractor sessions: the original LongMemEval-S dev haystacks (1,132 distinct sessions) plus the
# other LoCoMo conversations; a 2,500-session haystack reuses sources (see memlib/scale/haystack.py)
FILLER_FILE = "longmemeval_s_dev24.json"


def _recall(per_question: pl.DataFrame, tenant: str, strategy: str, k: int = 10) -> float | None:
    import polars as pl

    rows = per_question.filter((pl.col("tenant_id") == tenant) & (pl.col("group") == "overall")
                               & (pl.col("strategy") == strategy))
    return round(float(rows.get_column(f"turn_recall@{k}").mean()), 4) if rows.height else None


def _latency(per_question: pl.DataFrame, tenant: str, strategy: str) -> dict[str, float]:
    import polars as pl

    lat = per_question.filter((pl.col("tenant_id") == tenant) & (pl.col("strategy") == strategy)).get_column(
        "latency_ms")
    if lat.len() == 0:
        return {}
    return {"p50_ms": round(float(lat.quantile(0.5)), 2), "p95_ms": round(float(lat.quantile(0.95)), 2)}


def strategy_figures(hay: pl.DataFrame, alone: pl.DataFrame, strategy: str, hay_tenant: str,
                     alone_tenant: str) -> dict:
    """One strategy's haystack and alone turn R@10, recall_ratio, and in-process p50/p95 on both
    tenants (same run), with ``p50_ratio`` = haystack p50 / alone p50."""
    h, a = _recall(hay, hay_tenant, strategy), _recall(alone, alone_tenant, strategy)
    lat_h, lat_a = _latency(hay, hay_tenant, strategy), _latency(alone, alone_tenant, strategy)
    out = {"haystack_turn_recall@10": h, "conversation_turn_recall@10": a,
           "recall_ratio": round(h / a, 4) if h is not None and a else None,
           **{f"inprocess_{k}": v for k, v in lat_h.items()},
           **{f"alone_inprocess_{k}": v for k, v in lat_a.items()}}
    if lat_h and lat_a and lat_a["p50_ms"] > 0:
        out["p50_ratio"] = round(lat_h["p50_ms"] / lat_a["p50_ms"], 3)
    return out


def _compose(data: Path, workdir: Path, conversation: str, sessions: int, tenants: int,
             seed: int) -> tuple[dict, list[str]]:
    """Write the corpus: ``scale.jsonl`` (the measured build) and, for the haystack run, ``alone.jsonl``
    (the evaluated conversation by itself, built as a separate store so the two builds share nothing)."""
    from memlib.scale.haystack import HaystackSpec, Pool, compose_haystack, filler_summary, many_tenants, write_jsonl

    pool = Pool.load(data / "locomo_dev3.json", [data / FILLER_FILE])
    spec = HaystackSpec(sessions=sessions, seed=seed)
    if tenants:
        turns, questions = many_tenants(pool, tenants, spec)
        return write_jsonl(workdir / "scale.jsonl", turns, questions), [q.get_column("tenant_id")[0]
                                                                         for q in questions if q.height]
    big_t, big_q = compose_haystack(pool, conversation, f"{conversation}-hay", spec)
    alone_t, alone_q = compose_haystack(pool, conversation, conversation, HaystackSpec(sessions=0))
    alone_counts = write_jsonl(workdir / "alone.jsonl", [alone_t], [alone_q])
    (workdir / "alone.counts.json").write_text(json.dumps(alone_counts))
    counts = {**write_jsonl(workdir / "scale.jsonl", [big_t], [big_q]), "filler_file": FILLER_FILE,
              **filler_summary(pool, conversation, spec)}
    return counts, [f"{conversation}-hay", conversation]


def http_latency(store: Path, cfg, tenant: str, queries: list[str], strategy: str,
                 num_cpus: Optional[int]) -> dict[str, float]:
    """p50/p95 of ``POST /search`` through the real service (Ray Serve HTTP proxy, memlib.client),
    one request at a time, after one warm-up request (tenant load)."""
    import polars as pl

    from jobs import serve as serve_job
    from jobs.local_ray import release_ray
    from memlib.client import MemlibClient
    from memlib.serve.auth import hash_token, new_token

    release_ray()  # the build's local Ray: Serve starts its own
    token = new_token()  # a tenant token made for this run: requests take the authenticated path
    cfg = cfg.model_copy(deep=True)
    cfg.serve.tenant_token_hashes = {**cfg.serve.tenant_token_hashes, tenant: hash_token(token)}
    url = serve_job.start(store, cfg, host="127.0.0.1", port=serve_job.free_port(), num_cpus=num_cpus)
    try:
        with MemlibClient(url, token=token, timeout=120.0) as client:
            client.search(tenant, queries[0], strategy=strategy, k=10)
            lat = []
            for q in queries:
                t0 = time.perf_counter()
                client.search(tenant, q, strategy=strategy, k=10)
                lat.append((time.perf_counter() - t0) * 1000)
    finally:
        serve_job.stop()
    s = pl.Series(lat)
    return {"p50_ms": round(float(s.quantile(0.5)), 2), "p95_ms": round(float(s.quantile(0.95)), 2),
            "latency_source": "http", "latency_requests": len(lat)}


def _evaluate(store: Path, strategy: list[str], cfg) -> pl.DataFrame:
    from memlib.eval.questions import Dataset
    from memlib.eval.runner import evaluate
    from memlib.io.store import StoreReader

    questions = StoreReader(store).table("questions")
    return evaluate(store, questions, strategy, [10], cfg, dataset=Dataset.LOCOMO).per_question


def tenant_speedup(corpus: Path, workdir: Path, num_cpus: Optional[int], config: Optional[Path] = None,
                   sets: Optional[list[str]] = None) -> dict:
    """The haystack tenant built twice more, each in a fresh process with a local Ray of its own:
    on one core (affinity: every Ray process shares that core; ``--num-cpus 1``) and on every
    core of the run. ``tenant_speedup`` = one-core wall / all-core wall, same run: the staged
    build spreads one tenant's sessions over all embed and session-local actors."""
    from jobs.bench.measure import timed_build
    from jobs.local_ray import release_ray

    release_ray()
    cores = sorted(os.sched_getaffinity(0))
    n = num_cpus or len(cores)
    one = timed_build(corpus, workdir / "store_1core", 1, {cores[0]}, workdir / "build_1core.log", config, sets)
    shutil.rmtree(workdir / "store_1core", ignore_errors=True)
    many = timed_build(corpus, workdir / f"store_{n}core", n, set(cores[:n]), workdir / f"build_{n}core.log",
                       config, sets)
    shutil.rmtree(workdir / f"store_{n}core", ignore_errors=True)
    return {"build_1core_s": round(one, 1), f"build_{n}core_s": round(many, 1), "speedup_cores": n,
            "tenant_speedup": round(one / many, 3) if many else None}


def built_store(cfg, corpus: Path, store: Path, turns: int, num_cpus: Optional[int]) -> tuple[dict, float | None]:
    """(manifest, build seconds) of ``store``: built from ``corpus`` unless it already holds a
    published build of the same number of turns (then reused: build seconds None)."""
    from jobs.builder import run_build

    if (store / "manifest.json").exists():
        manifest = json.loads((store / "manifest.json").read_text())
        if manifest["row_counts"]["turns"] != turns:
            raise typer.BadParameter(f"store {store}: holds {manifest['row_counts']['turns']} turns, the "
                                     f"composed corpus {turns}; not the same haystack (other --sessions or --seed?)")
        return manifest, None
    start = time.perf_counter()
    manifest = run_build(cfg, corpus, "jsonl", store, num_cpus=num_cpus)
    return manifest, time.perf_counter() - start


def _questions(per_question: pl.DataFrame, tenant: str) -> list[str]:
    import polars as pl

    return per_question.filter(pl.col("tenant_id") == tenant).get_column("question").unique(
        maintain_order=True).to_list()


def paired_latency(hay_store: Path, alone_store: Path, hay_tenant: str, alone_tenant: str, strategy: str, cfg,
                   queries: list[str], block: int = 10) -> dict:
    """In-process latency of ``strategy`` on the haystack tenant and on the conversation alone,
    measured interleaved: the queries in blocks of ``block``, each block on one tenant then on the
    other (the first tenant alternating), so both see the same machine state. A sequential run
    (every haystack query, then every alone query, as ``memlib eval`` does per store) lets the
    machine's drift between the two halves into the ratio: 2.07-2.58 over five runs of one commit
    (docs/performance.md). Same search path as ``memlib eval``: warm tenants, query vectors
    embedded beforehand, run_search's latency."""
    import numpy as np

    from memlib.eval.runner import default_embedder
    from memlib.retrieve.kernels import run_search
    from memlib.retrieve.registry import get_strategy
    from memlib.retrieve.tenant import CachedQueryEmbedder
    from memlib.retrieve.tenant_cache import TenantCache

    qemb = CachedQueryEmbedder(default_embedder(cfg, hay_store))  # both stores built with one config
    qemb.prime(queries)
    strat = get_strategy(strategy, cfg)
    indexes = {"hay": TenantCache(hay_store, embedder=qemb).get(hay_tenant),
               "alone": TenantCache(alone_store, embedder=qemb).get(alone_tenant)}
    for index in indexes.values():  # the first query of a tenant loads its caches: not timed
        run_search(index, strat, queries[0], 10)
    lat: dict[str, list[float]] = {"hay": [], "alone": []}
    for i, start in enumerate(range(0, len(queries), block)):
        for name in (("hay", "alone") if i % 2 == 0 else ("alone", "hay")):
            for q in queries[start:start + block]:
                lat[name].append(run_search(indexes[name], strat, q, 10).latency_ms)
    p50 = {k: float(np.median(v)) for k, v in lat.items()}
    return {"paired_p50_ms": round(p50["hay"], 2), "paired_alone_p50_ms": round(p50["alone"], 2),
            "paired_p95_ms": round(float(np.percentile(lat["hay"], 95)), 2),
            "paired_alone_p95_ms": round(float(np.percentile(lat["alone"], 95)), 2),
            "paired_p50_ratio": round(p50["hay"] / p50["alone"], 3) if p50["alone"] > 0 else None,
            "paired_queries": len(queries), "paired_block": block}


def _also(stores: list[Path], strategies: list[str], alone: pl.DataFrame, tenants: list[str], cfg) -> dict:
    """Further haystack stores of the same conversation (other sizes), evaluated in the same run."""
    import polars as pl

    from memlib.io.store import StoreReader

    out = {}
    for store in stores:
        pq = _evaluate(store, strategies, cfg)
        turns = pl.from_arrow(StoreReader(store).table("turns", columns=["session_id"]))
        out[f"{turns.get_column('session_id').n_unique()}_sessions"] = {
            "store": str(store), "turns": turns.height,
            **{s: strategy_figures(pq, alone, s, *tenants) for s in strategies}}
    return out


def run_scale(cfg, data: Path, workdir: Path, *, conversation: str, sessions: int, tenants: int, seed: int,
              strategies: list[str], num_cpus: Optional[int], http: bool = True, speedup: bool = True,
              config: Optional[Path] = None, sets: Optional[list[str]] = None, store: Optional[Path] = None,
              alone_store: Optional[Path] = None, also: Optional[list[Path]] = None) -> dict:
    from jobs.bench.measure import RssSampler
    from jobs.builder.tenants import allow_long_tenants

    allow_long_tenants()  # the haystack tenant builds for longer than Ray Data's default 1800 s
    counts, evaluated = _compose(data, workdir, conversation, sessions, tenants, seed)
    store = store or workdir / "store"
    with RssSampler() as rss:
        manifest, build_s = built_store(cfg, workdir / "scale.jsonl", store, counts["turns"], num_cpus)
    pq = _evaluate(store, strategies, cfg)
    queries = _questions(pq, evaluated[0])  # the first evaluated tenant's questions, for latency
    out = {"mode": "tenants" if tenants else "haystack", **counts, "store": str(store),
           "build_s": round(build_s, 1) if build_s is not None else None, "store_reused": build_s is None,
           "peak_rss_mb": round(rss.peak / 2**20) if build_s is not None else None,
           "turns_per_s": round(counts["turns"] / build_s, 1) if build_s else None,
           "nodes": manifest["row_counts"]["nodes"], "edges": manifest["row_counts"]["edges"],
           "strategy": strategies[0], "strategies": strategies, "embed_backend": cfg.embed.backend,
           "embed_dim": cfg.embed.dim, "stage_timings_s": manifest["stage_timings_s"]}
    if tenants:
        out["turn_recall@10"] = {t: _recall(pq, t, strategies[0]) for t in evaluated}
        inproc = _latency(pq, evaluated[0], strategies[0])
        out.update({**{f"inprocess_{k}": v for k, v in inproc.items()}, **inproc, "latency_source": "in-process"})
    else:
        alone_store = alone_store or workdir / "alone_store"
        alone_turns = json.loads((workdir / "alone.counts.json").read_text())["turns"]
        built_store(cfg, workdir / "alone.jsonl", alone_store, alone_turns, num_cpus)
        alone = _evaluate(alone_store, strategies, cfg)
        figures = {s: strategy_figures(pq, alone, s, *evaluated) for s in strategies}
        out.update({"alone_store": str(alone_store), "by_strategy": figures, **figures[strategies[0]]})
        out.update({"p50_ms": out.get("inprocess_p50_ms"), "p95_ms": out.get("inprocess_p95_ms"),
                    "latency_source": "in-process"})
        out.update(paired_latency(store, alone_store, *evaluated, strategies[0], cfg, queries))
        if also:
            out["also"] = _also(also, strategies, alone, evaluated, cfg)
            for entry in out["also"].values():
                entry.update(paired_latency(Path(entry["store"]), alone_store, *evaluated, strategies[0], cfg, queries))
    if http:
        out.update(http_latency(store, cfg, evaluated[0], queries, strategies[0], num_cpus))
    if speedup and not tenants:
        out.update(tenant_speedup(workdir / "scale.jsonl", workdir, num_cpus, config, sets))
    return out


def register(bench_app: typer.Typer) -> None:
    @bench_app.command("scale")
    def scale(
        data: Annotated[Path, typer.Option("--data", help="directory with locomo_dev3.json and the LongMemEval "
                                           "haystacks")] = Path("../shared/data"),
        conversation: Annotated[str, typer.Option("--conversation", help="LoCoMo conversation evaluated inside "
                                                  "the haystack")] = "conv-26",
        sessions: Annotated[int, typer.Option("--sessions", help="sessions of the haystack tenant "
                                              "(LongMemEval-l: 2500; small values for a smoke run)")] = 2500,
        tenants: Annotated[int, typer.Option("--tenants", help="many-tenant run: this many tenants instead of "
                                             "one haystack")] = 0,
        tenant_size: Annotated[TenantSize, typer.Option("--tenant-size", help="size of each tenant in the "
                                                        "many-tenant run")] = TenantSize.LOCOMO,
        strategies: Annotated[Optional[str], typer.Option("--strategies", "--strategy", help="comma-separated "
                              "strategies evaluated, each with its recall_ratio (default: the configured "
                              "default strategy, retrieve.default_strategy); the first one is timed over HTTP")] = None,
        store: Annotated[Optional[Path], typer.Option("--store", help="haystack store: reused when it holds a "
                         "published build of the composed haystack, else built there and kept")] = None,
        alone_store: Annotated[Optional[Path], typer.Option("--alone-store", help="store of the conversation "
                               "alone: reused or built there, as --store")] = None,
        also: Annotated[Optional[list[Path]], typer.Option("--also-store", help="further built haystack stores of "
                        "the same conversation (other --sessions), evaluated in the same run")] = None,
        seed: Annotated[int, typer.Option("--seed")] = 0,
        num_cpus: Annotated[Optional[int], typer.Option("--num-cpus")] = None,
        workdir: Annotated[Optional[Path], typer.Option("--workdir", help="where corpus and store go "
                                                        "(default: a temporary directory, removed)")] = None,
        http: Annotated[bool, typer.Option("--http/--no-http", help="measure latency through the real HTTP "
                                           "service (Ray Serve) as well")] = True,
        speedup: Annotated[bool, typer.Option("--speedup/--no-speedup", help="haystack run: build the same "
                                              "tenant again with one CPU (tenant_speedup)")] = True,
        config: ConfigOpt = None,
        set_: SetOpt = None,
    ) -> None:
        """Scale benchmark: haystack build + recall ratio + search latency, one JSON line."""
        cfg = get_config(config, set_)
        names = [s.strip() for s in (strategies or cfg.retrieve.default_strategy).split(",") if s.strip()]
        tmp = workdir or Path(tempfile.mkdtemp(prefix="memlib-scale-"))
        try:
            res = run_scale(cfg, data, tmp, conversation=conversation, sessions=sessions, tenants=tenants,
                            seed=seed, strategies=names, num_cpus=num_cpus, http=http, speedup=speedup,
                            config=config, sets=set_, store=store, alone_store=alone_store, also=also)
        finally:
            if workdir is None:
                shutil.rmtree(tmp, ignore_errors=True)
        res["tenant_size"] = tenant_size.value if tenants else None
        typer.echo(json.dumps(res))
