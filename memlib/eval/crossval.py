"""Fold selection and cross-validated figures for ``memlib tune`` (protocol: memlib/eval/tune.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import polars as pl

from memlib.eval import metrics as M
from memlib.eval.tune import FOLD


@dataclass
class Scored:
    """Per-question metrics of every configuration on one dataset (``frames[i]`` for ``configs[i]``)."""
    name: str
    metrics: Sequence[str]          # this dataset's objective metrics
    frames: list[pl.DataFrame]      # tenant_id, question_id, category, fold, metric columns


@dataclass
class FoldResult:
    fold: int
    chosen: int                     # index into the grid
    train_objective: float
    held_out: dict[str, dict[str, float]] = field(default_factory=dict)  # dataset -> metric means


def dataset_score(frame: pl.DataFrame, metrics: Sequence[str]) -> float:
    """Mean over ``metrics`` of their means over the frame's questions (0 for no question)."""
    if frame.height == 0:
        return 0.0
    return float(sum(frame.get_column(m).mean() for m in metrics) / len(metrics))


def objective(data: Sequence[Scored], config: int, folds: set[int] | None) -> float:
    """Mean over datasets of :func:`dataset_score` on the questions of ``folds`` (None: all)."""
    scores = [dataset_score(_in(d.frames[config], folds), d.metrics) for d in data]
    return sum(scores) / len(scores)


def _in(frame: pl.DataFrame, folds: set[int] | None) -> pl.DataFrame:
    return frame if folds is None else frame.filter(pl.col(FOLD).is_in(sorted(folds)))


def best(data: Sequence[Scored], folds: set[int] | None) -> tuple[int, float]:
    """(grid index, objective) of the best configuration on ``folds``; ties go to the earlier one."""
    n = len(data[0].frames)
    values = [objective(data, i, folds) for i in range(n)]
    top = max(range(n), key=lambda i: (values[i], -i))
    return top, values[top]


def cross_validate(data: Sequence[Scored], n_folds: int) -> tuple[list[FoldResult], dict[str, pl.DataFrame]]:
    """Per fold the configuration chosen on the other folds and its held-out figures; and per
    dataset the pooled held-out per-question rows (each scored by its fold's choice)."""
    results: list[FoldResult] = []
    pooled: dict[str, list[pl.DataFrame]] = {d.name: [] for d in data}
    for f in range(n_folds):
        train = set(range(n_folds)) - {f}
        chosen, value = best(data, train)
        res = FoldResult(f, chosen, value)
        for d in data:
            held = _in(d.frames[chosen], {f})
            pooled[d.name].append(held)
            res.held_out[d.name] = _means(held)
        results.append(res)
    return results, {name: pl.concat(parts) for name, parts in pooled.items()}


def _means(frame: pl.DataFrame) -> dict[str, float]:
    return {k: v for k, v in M.summarize(frame).items() if k != "latency_ms_p95"}


def figures(frame: pl.DataFrame) -> dict[str, Any]:
    """Overall, per-category and per-tenant means of a per-question frame."""
    out: dict[str, Any] = _means(frame)
    out["by_category"] = M.by_category(frame)
    out["by_tenant"] = {t: _means(frame.filter(pl.col("tenant_id") == t))
                        for t in sorted(frame.get_column("tenant_id").unique().to_list())}
    return out
