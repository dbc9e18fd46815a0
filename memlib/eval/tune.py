"""Cross-validated tuning of a retrieval strategy's parameters over several datasets at once.

Protocol (``memlib tune``):

* Every dataset's tenants are split into ``n_folds`` folds; a tenant (a LoCoMo conversation, a
  LongMemEval haystack) never spans two folds. Tenants whose questions share one category (one
  LongMemEval question per haystack) are dealt round-robin per category, so each fold holds
  every question type; the others (LoCoMo conversations) in tenant order. With locomo_dev3's
  three conversations and three folds, each fold holds out one conversation.
* Fold ``f``: every configuration of the grid is scored on the questions of all other folds of
  every dataset together; the one with the best objective (ties: the earlier in the grid) is
  chosen, one configuration for all datasets, and scored on fold ``f``'s questions.
* The cross-validated figures pool the held-out questions of all folds: every question is
  scored by a configuration chosen without it (and without its conversation).
* The objective is the mean over datasets of the mean of each dataset's objective metrics.

Per-question results are cached per configuration, dataset and store version, keyed by the
source of memlib/retrieve and memlib/eval, so a larger grid only computes the new
configurations.
"""
from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import polars as pl

from memlib.config import MemlibConfig
from memlib.eval import metrics as M
from memlib.eval.questions import Dataset, Group, QuestionSet, read_questions, select_questions
from memlib.eval.runner import rank_depth, score_rows, search_rows
from memlib.retrieve.tenant import CachedQueryEmbedder
from memlib.retrieve.tenant_cache import TenantCache

FOLD = "fold"
DEFAULT_OBJECTIVE = {
    Dataset.LOCOMO: ("turn_recall@10", "turn_recall@5", "session_recall@10"),
    Dataset.LONGMEMEVAL: ("turn_recall@5", "lme_turn_recall_all@10", "lme_session_recall_all@5"),
}
KS = (1, 3, 5, 10, 20)


@dataclass
class TuneData:
    dataset: Dataset
    store: Path
    questions: pl.DataFrame  # the scored questions (group overall) with a fold column

    @property
    def name(self) -> str:
        return self.dataset.value


def parse_grid(specs: Sequence[str]) -> list[dict[str, Any]]:
    """``["a=1,2", "b=x"]`` -> the cartesian product ``[{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]``
    (the first value of the first key varies slowest). Values are JSON (numbers, true/false)
    or plain strings."""
    keys, values = [], []
    for spec in specs:
        key, sep, vals = spec.partition("=")
        if not sep or not key.strip() or not vals.strip():
            raise ValueError(f"grid entry {spec!r} is not key=v1,v2,...")
        keys.append(key.strip())
        values.append([_value(v.strip()) for v in vals.split(",")])
    return [dict(zip(keys, combo)) for combo in itertools.product(*values)]


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def assign_folds(questions: pl.DataFrame, n_folds: int, offset: int = 0) -> pl.DataFrame:
    """``questions`` plus a ``fold`` column: whole tenants per fold (see the module docstring)."""
    cats = questions.group_by("tenant_id").agg(pl.col("category").cast(pl.Utf8).unique().alias("cats"))
    stratum = {t: (c[0] if len(c) == 1 else "") for t, c in zip(cats["tenant_id"], cats["cats"].to_list())}
    fold: dict[str, int] = {}
    turn = offset
    for key in sorted(set(stratum.values())):
        for tenant in sorted(t for t, s in stratum.items() if s == key):
            fold[tenant] = turn % n_folds
            turn += 1
    return questions.with_columns(pl.col("tenant_id").replace_strict(fold, return_dtype=pl.Int64).alias(FOLD))


def load_data(fmt: str, store: str | Path, input_path: str | Path | None, cfg: MemlibConfig, n_folds: int) -> TuneData:
    """The scored questions of ``input_path`` (None: the store's questions table), with folds."""
    from memlib.io.store import StoreReader

    dataset = Dataset(fmt)
    reader = StoreReader(store)
    questions = read_questions(input_path, dataset, cfg) if input_path else reader.table("questions")
    qset: QuestionSet = select_questions(questions, reader, dataset)
    return TuneData(dataset, Path(store), assign_folds(qset.group(Group.OVERALL), n_folds))


def code_digest() -> str:
    """sha256 (12 hex) of the retrieval and evaluation source: cached results of other code are not reused."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted([*root.joinpath("retrieve").rglob("*.py"), *root.joinpath("eval").glob("*.py")]):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def config_key(strategy: str, params: dict[str, Any]) -> str:
    return json.dumps({"strategy": strategy, "params": params}, sort_keys=True)


def per_question(data: TuneData, strategy: str, configs: list[dict[str, Any]], cfg: MemlibConfig,
                 cache_dir: Path | None, progress=None) -> list[pl.DataFrame]:
    """Per-question metrics of every configuration on ``data`` (cached), in grid order."""
    cache = TenantCache(data.store, embedder=CachedQueryEmbedder(_embedder(cfg, data.store)), max_tenants=4)
    base = dict(cfg.retrieve.params.get(strategy, {}))  # --set overrides are part of each configuration
    paths = [_cache_path(cache_dir, data, cache.version, strategy, {**base, **c}) for c in configs]
    todo = [i for i, p in enumerate(paths) if p is None or not p.exists()]
    rows: dict[int, list[dict[str, Any]]] = {i: [] for i in todo}
    depth = rank_depth(KS, data.dataset)
    qs = data.questions.sort(["tenant_id", "question_id"])
    for tenant in qs.get_column("tenant_id").unique(maintain_order=True).to_list() if todo else []:
        tq = qs.filter(pl.col("tenant_id") == tenant)
        for i in todo:
            rows[i].extend(search_rows(cache, strategy, _with_params(cfg, strategy, configs[i]), tq, depth, None))
        if progress is not None:
            progress(data.name, tenant)
    out = []
    for i, path in enumerate(paths):
        if i in rows:
            frame = _slim(score_rows(qs, rows[i], KS, data.dataset))
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                frame.write_parquet(path)
        else:
            frame = pl.read_parquet(path)
        out.append(frame.join(data.questions.select("tenant_id", "question_id", FOLD), on=["tenant_id", "question_id"]))
    return out


def _slim(frame: pl.DataFrame) -> pl.DataFrame:
    """Ids, category, latency and the metric columns of a scored frame."""
    return frame.select("tenant_id", "question_id", pl.col("category").cast(pl.Utf8), "latency_ms",
                        *M.metric_columns(frame))


def _embedder(cfg: MemlibConfig, store: Path):
    from memlib.eval.runner import default_embedder

    return default_embedder(cfg, store)


def _with_params(cfg: MemlibConfig, strategy: str, params: dict[str, Any]) -> MemlibConfig:
    out = cfg.model_copy(deep=True)
    out.retrieve.params = {**out.retrieve.params, strategy: {**out.retrieve.params.get(strategy, {}), **params}}
    return out


def _cache_path(cache_dir: Path | None, data: TuneData, version: str, strategy: str,
                params: dict[str, Any]) -> Path | None:
    if cache_dir is None:
        return None
    key = json.dumps([config_key(strategy, params), data.name, str(data.store.resolve()), version, code_digest()])
    return cache_dir / f"{strategy}-{data.name}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.parquet"
