"""``memlib tune`` outputs: tune.json (everything) and tune.md (the tables)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import polars as pl

from memlib.eval.crossval import FoldResult, Scored, best, dataset_score, figures, objective
from memlib.eval.tune import FOLD

SHOWN = {"locomo": ("turn_recall@5", "turn_recall@10", "turn_recall@20", "session_recall@5", "session_recall@10",
                    "turn_ndcg@10"),
         "longmemeval": ("lme_session_recall_all@5", "lme_session_recall_all@10", "lme_turn_recall_all@5",
                         "lme_turn_recall_all@10", "lme_turn_recall_all@50", "lme_turn_ndcg_any@10",
                         "turn_recall@5", "turn_recall@10", "lme_turn_recall_any@5")}
TOP_CONFIGS = 25


def _pct(v: Any) -> str:
    return f"{100 * v:.1f}" if isinstance(v, (int, float)) else "–"


def summary(strategy: str, configs: list[dict[str, Any]], data: Sequence[Scored], folds: list[FoldResult],
            pooled: dict[str, pl.DataFrame], n_folds: int) -> dict[str, Any]:
    """The JSON-able result of a tuning run."""
    in_idx, in_value = best(data, None)
    ranking = sorted(range(len(configs)), key=lambda i: -objective(data, i, None))
    return {
        "strategy": strategy, "n_configs": len(configs), "n_folds": n_folds,
        "objective": {d.name: list(d.metrics) for d in data},
        "folds": [{"fold": f.fold, "held_out_tenants": _fold_tenants(data, f.fold), "chosen": configs[f.chosen],
                   "train_objective": f.train_objective, "held_out": f.held_out} for f in folds],
        "cross_validated": {name: figures(frame) for name, frame in pooled.items()},
        "cross_validated_objective": sum(dataset_score(pooled[d.name], d.metrics) for d in data) / len(data),
        "in_sample": {"params": configs[in_idx], "objective": in_value,
                      "figures": {d.name: figures(d.frames[in_idx]) for d in data}},
        "grid": [{"params": configs[i], "objective": objective(data, i, None),
                  **{d.name: dataset_score(d.frames[i], d.metrics) for d in data},
                  "by_tenant_turn_recall@10": _by_tenant(data, i)} for i in ranking],
    }


def _fold_tenants(data: Sequence[Scored], fold: int) -> dict[str, list[str]]:
    return {d.name: sorted(d.frames[0].filter(pl.col(FOLD) == fold).get_column("tenant_id").unique().to_list())
            for d in data}


def _by_tenant(data: Sequence[Scored], i: int) -> dict[str, float]:
    """turn_recall@10 per tenant of the datasets with several questions per tenant (LoCoMo)."""
    out: dict[str, float] = {}
    for d in data:
        frame = d.frames[i]
        if frame.height > frame.get_column("tenant_id").n_unique():
            means = frame.group_by("tenant_id").agg(pl.col("turn_recall@10").mean()).sort("tenant_id")
            out.update(dict(zip(means["tenant_id"].to_list(), means["turn_recall@10"].to_list())))
    return out


def markdown(res: dict[str, Any]) -> str:
    parts = [f"# memlib tune: {res['strategy']}, {res['n_configs']} configurations, {res['n_folds']} folds", "",
             "Objective: mean over datasets of the mean of " + "; ".join(
                 f"{n}: {', '.join(m)}" for n, m in res["objective"].items()) + ".", "",
             "## Folds (configuration chosen on the other folds, scored on this one)", "",
             "| fold | held out | chosen | train objective | " + " | ".join(
                 f"{n} held-out objective metrics" for n in res["objective"]) + " |",
             "|---|---|---|---|" + "---|" * len(res["objective"])]
    for f in res["folds"]:
        held = "; ".join(f"{n}: {', '.join(t) if len(t) <= 3 else f'{len(t)} tenants'}"
                         for n, t in f["held_out_tenants"].items())
        cells = [" / ".join(_pct(f["held_out"][n].get(m)) for m in ms) for n, ms in res["objective"].items()]
        parts.append(f"| {f['fold']} | {held} | `{json.dumps(f['chosen'], sort_keys=True)}` | "
                     f"{_pct(f['train_objective'])} | " + " | ".join(cells) + " |")
    parts += ["", f"## Cross-validated figures (objective {_pct(res['cross_validated_objective'])})", ""]
    for name, fig in res["cross_validated"].items():
        parts += [_figure_table(name, fig, "cross-validated"), ""]
    ins = res["in_sample"]
    parts += [f"## In-sample best (all folds; not an estimate): `{json.dumps(ins['params'], sort_keys=True)}`, "
              f"objective {_pct(ins['objective'])}", ""]
    for name, fig in ins["figures"].items():
        parts += [_figure_table(name, fig, "in-sample"), ""]
    parts += [_grid_table(res), ""]
    return "\n".join(parts)


def _figure_table(name: str, fig: dict[str, Any], label: str) -> str:
    cols = [c for c in SHOWN.get(name, ()) if c in fig]
    rows = [f"| {name} {label} ({fig.get('n_questions', 0)} q) | " + " | ".join(_pct(fig.get(c)) for c in cols) + " |"]
    rows += [f"| {cat} ({v.get('n_questions', 0)} q) | " + " | ".join(_pct(v.get(c)) for c in cols) + " |"
             for cat, v in fig.get("by_category", {}).items()]
    if len(fig.get("by_tenant", {})) <= 5:
        rows += [f"| {t} ({v.get('n_questions', 0)} q) | " + " | ".join(_pct(v.get(c)) for c in cols) + " |"
                 for t, v in fig.get("by_tenant", {}).items()]
    return "\n".join([f"| {name} | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols), *rows])


def _grid_table(res: dict[str, Any]) -> str:
    names = list(res["objective"])
    tenants = sorted({t for g in res["grid"] for t in g["by_tenant_turn_recall@10"]})
    head = ["## Grid on all questions (best first; in-sample)", "",
            "| params | objective | " + " | ".join(names) + " | " + " | ".join(f"{t} R@10" for t in tenants) + " |",
            "|---|---|" + "---|" * (len(names) + len(tenants))]
    rows = [f"| `{json.dumps(g['params'], sort_keys=True)}` | {_pct(g['objective'])} | "
            + " | ".join(_pct(g[n]) for n in names) + " | "
            + " | ".join(_pct(g["by_tenant_turn_recall@10"].get(t)) for t in tenants) + " |"
            for g in res["grid"][:TOP_CONFIGS]]
    return "\n".join(head + rows)


def write(res: dict[str, Any], out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "tune.json", out / "tune.md"
    js.write_text(json.dumps(res, indent=2, default=str), encoding="utf-8")
    md.write_text(markdown(res), encoding="utf-8")
    return js, md
