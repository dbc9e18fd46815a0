"""Run retrieval strategies over a store's questions, in-process, and score them."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

import polars as pl
import pyarrow as pa

from memlib.config import MemlibConfig
from memlib.embed.base import EmbedError
from memlib.eval import lme
from memlib.eval import metrics as M
from memlib.eval.questions import Dataset, Group, QuestionSet, select_questions
from memlib.eval.report import EvalRun
from memlib.io.errors import InputError
from memlib.io.store import StoreError
from memlib.retrieve.kernels import run_search
from memlib.retrieve.registry import get_strategy, parse_strategies, strategy_class
from memlib.retrieve.tenant import CachedQueryEmbedder, QueryEmbedder
from memlib.retrieve.tenant_cache import TenantCache

RANKED_DEPTH = 20  # ranked_turn_ids kept per question in per_question.parquet
EVAL_CACHE_TENANTS = 8  # tenants kept loaded while questions are processed tenant by tenant
Progress = Callable[[str, int, int], None]


class LazyEmbedder:
    """Builds the query embedder on first use (lexical-only runs never load a model). With a
    ``store``, the embedder is the one the store was built with (its vector space; runtime
    settings from ``cfg``): decided now, so a config that contradicts the store fails before any
    question is scored (:func:`memlib.embed.space.store_embed_config`)."""

    def __init__(self, cfg: MemlibConfig, store: str | Path | None = None):
        from memlib.embed.space import store_embed_config
        from memlib.io.store import read_manifest

        self.cfg = cfg
        self.embed_cfg = (cfg.embed if store is None
                          else store_embed_config(cfg.embed, read_manifest(store), store=str(store)))
        self._inner: QueryEmbedder | None = None

    def embed_queries(self, texts: Sequence[str]):
        return self._embedder().embed_queries(texts)

    @property
    def query_concurrency(self) -> int:
        return int(getattr(self._embedder(), "query_concurrency", 1))

    def _embedder(self) -> QueryEmbedder:
        if self._inner is None:
            from memlib.embed import get_embedder

            self._inner = get_embedder(self.embed_cfg)
        return self._inner


def default_embedder(cfg: MemlibConfig, store: str | Path | None = None) -> QueryEmbedder:
    """The query embedder for ``store`` (the one its nodes were embedded with), built on first use."""
    return LazyEmbedder(cfg, store)


def uses_query_vector(name: str) -> bool:
    """Strategies declare ``uses_query_vector = False`` when they never embed the query."""
    return bool(getattr(strategy_class(name), "uses_query_vector", True))


_RUN_ERRORS = (StoreError, EmbedError, InputError, FileNotFoundError)


class StrategyFailed(RuntimeError):
    """A strategy raised on a question: which strategy, tenant and question, and why."""

    def __init__(self, strategy: str, tenant: str, question_id: str, exc: BaseException):
        self.strategy, self.tenant, self.question_id = strategy, tenant, question_id
        self.reason = f"{type(exc).__name__}: {str(exc)[:500]}".replace("\n", " ")
        super().__init__(f"strategy {strategy!r} failed on tenant {tenant!r}, question {question_id!r}: "
                         f"{self.reason}")

    def to_json(self) -> dict[str, str]:
        return {"tenant_id": self.tenant, "question_id": self.question_id, "error": self.reason}


def search_rows(cache: TenantCache, name: str, cfg: MemlibConfig, qs: pl.DataFrame, depth: int,
                 progress: Progress | None) -> list[dict[str, Any]]:
    strategy = get_strategy(name, cfg)
    # a strategy that reads the question's time (``auto``) is given it, as LongMemEval asks
    timed = "question_time" in getattr(strategy, "defaults", {}) and "question_time" in qs.columns
    rows: list[dict[str, Any]] = []
    warmed: set[str] = set()
    for i, q in enumerate(qs.iter_rows(named=True)):
        tenant = q["tenant_id"]
        warmup_ms = None
        try:
            if tenant not in warmed:
                # The first query of each tenant loads models, opens its indexes and builds per-tenant
                # caches (e.g. auto's token matrix): a one-off cost reported as warmup_ms, not latency.
                started = time.perf_counter()
                run_search(cache.get(tenant), strategy, q["question"], depth)
                warmup_ms = 1000.0 * (time.perf_counter() - started)
                warmed.add(tenant)
            extra = {"question_time": q["question_time"]} if timed and q["question_time"] is not None else {}
            res = run_search(cache.get(tenant), strategy, q["question"], depth, **extra)
        except _RUN_ERRORS:  # the store, the embedder or the input: every strategy would fail alike
            raise
        except Exception as exc:  # noqa: BLE001 - named with its strategy and question
            raise StrategyFailed(name, tenant, str(q["question_id"]), exc) from exc
        rows.append({"strategy": name, "tenant_id": tenant, "question_id": q["question_id"],
                     "ranked_turn_ids": res.turn_ids, "ranked_session_ids": res.session_ids,
                     "ranked_turn_sessions": [t.session_id for t in res.turns],
                     "latency_ms": res.latency_ms, "warmup_ms": warmup_ms, "n_nodes": len(res.nodes),
                     "context": res.context})
        if progress is not None:
            progress(name, i + 1, qs.height)
    return rows


def score_rows(qs: pl.DataFrame, hits: list[dict[str, Any]], ks: Sequence[int], dataset: Dataset) -> pl.DataFrame:
    res = pl.DataFrame(hits, schema_overrides={"ranked_turn_ids": pl.List(pl.Utf8), "warmup_ms": pl.Float64,
                                               "ranked_session_ids": pl.List(pl.Utf8),
                                               "ranked_turn_sessions": pl.List(pl.Utf8)})
    frame = qs.join(res, on=["tenant_id", "question_id"], how="inner", maintain_order="left")
    col = frame.get_column
    scores = M.score_questions(col("ranked_turn_ids").to_list(), col("evidence").to_list(),
                               col("ranked_session_ids").to_list(), col("evidence_sessions").to_list(), ks)
    if dataset is Dataset.LONGMEMEVAL:
        scores.update(lme.score_questions(col("ranked_turn_ids").to_list(), col("ranked_turn_sessions").to_list(),
                                          col("evidence").to_list(), col("evidence_turn_sessions").to_list(),
                                          col("evidence_sessions").to_list()))
    frame = frame.with_columns([pl.Series(k, v) for k, v in scores.items()])
    return frame.with_columns(pl.col("ranked_turn_ids").list.head(RANKED_DEPTH),
                              pl.col("ranked_session_ids").list.head(RANKED_DEPTH),
                              pl.col("ranked_turn_sessions").list.head(RANKED_DEPTH))


def rank_depth(ks: Sequence[int], dataset: Dataset) -> int:
    """Ranked turns asked of every strategy: the largest k, at least :data:`RANKED_DEPTH`, and
    :data:`memlib.eval.lme.DEPTH` on LongMemEval (turn@50 and the session cut-off)."""
    return max(max(ks), RANKED_DEPTH, lme.DEPTH if dataset is Dataset.LONGMEMEVAL else 0)


def strategy_metrics(frame: pl.DataFrame) -> dict[str, Any]:
    overall = frame.filter(pl.col("group") == Group.OVERALL.value)
    out: dict[str, Any] = M.summarize(overall)
    out["by_category"] = M.by_category(overall)
    adversarial = frame.filter(pl.col("group") == Group.ADVERSARIAL.value)
    if adversarial.height:
        out["adversarial"] = M.summarize(adversarial)
    return out


def evaluate(store: str | Path, questions: QuestionSet | pa.Table | pl.DataFrame, strategies: Sequence[str] | str,
             ks: Sequence[int], cfg: MemlibConfig, *, dataset: Dataset = Dataset.STORE,
             embedder: QueryEmbedder | None = None, progress: Progress | None = None,
             keep_going: bool = False) -> EvalRun:
    """Every strategy over every selected question; per-question rows and aggregated metrics.

    A strategy that raises on a question raises :class:`StrategyFailed`; with ``keep_going`` the
    other strategies are still scored and the failure is reported in ``metrics["failed"]``
    (strategy -> tenant, question and error), the strategy left out of ``metrics["strategies"]``."""
    names = parse_strategies(strategies)
    ks = sorted(set(int(k) for k in ks))
    qemb = CachedQueryEmbedder(embedder if embedder is not None else default_embedder(cfg, store))
    cache = TenantCache(Path(store), embedder=qemb, max_tenants=EVAL_CACHE_TENANTS)
    qset = questions if isinstance(questions, QuestionSet) else select_questions(questions, cache.reader, dataset)
    qs = qset.frame.sort(["tenant_id", "question_id"])  # tenant-contiguous: one index load each
    need_vectors = qs.height > 0 and any(uses_query_vector(n) for n in names)
    embed_s = qemb.prime(qs.get_column("question").to_list()) if need_vectors else 0.0
    depth = rank_depth(ks, qset.dataset)
    frames: list[pl.DataFrame] = []
    failed: dict[str, dict[str, str]] = {}
    for n in names:
        try:
            frames.append(score_rows(qs, search_rows(cache, n, cfg, qs, depth, progress), ks, qset.dataset))
        except StrategyFailed as exc:
            if not keep_going:
                raise
            failed[n] = exc.to_json()
    scored = [n for n in names if n not in failed]
    per_question = pl.concat(frames) if frames else pl.DataFrame()
    metrics: dict[str, Any] = {
        "dataset": qset.dataset.value, "store": str(store), "store_version": cache.version, "ks": ks,
        "n_questions": qset.group(Group.OVERALL).height,
        "n_adversarial": qset.group(Group.ADVERSARIAL).height, **qset.counts(),
        "query_embedding_ms_per_query": 1000.0 * embed_s / max(qs.height, 1),
        "latency_note": "in-process search time per query on a warm tenant; query vectors are embedded "
                        "beforehand, each on its own as the service does (query_embedding_ms_per_query), and "
                        "not included; the first query of each tenant (index loads, per-tenant caches) is "
                        "timed apart as warmup_ms",
        "strategies": {n: strategy_metrics(per_question.filter(pl.col("strategy") == n)) for n in scored},
    }
    if failed:
        metrics["failed"] = failed
    return EvalRun(metrics, per_question)


def run_eval(store: str | Path, questions: QuestionSet | pa.Table | pl.DataFrame, strategies: Sequence[str] | str,
             ks: Sequence[int], cfg: MemlibConfig, *, dataset: Dataset = Dataset.STORE,
             embedder: QueryEmbedder | None = None, out: str | Path | None = None,
             progress: Progress | None = None) -> dict[str, Any]:
    """:func:`evaluate`, and write metrics.json, per_question.parquet, report.md and plots to ``out``."""
    run = evaluate(store, questions, strategies, ks, cfg, dataset=dataset, embedder=embedder, progress=progress)
    if out is not None:
        from memlib.eval.report import write_report

        write_report(run, Path(out))
    return run.metrics
