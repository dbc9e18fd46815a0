"""Evaluation outputs: metrics.json, per_question.parquet, report.md and PNG plots."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import polars as pl


@dataclass
class EvalRun:
    """What an evaluation run produced (:func:`memlib.eval.runner.evaluate`)."""
    metrics: dict[str, Any]
    per_question: pl.DataFrame


TABLE_METRICS = ("turn_recall@5", "turn_recall@10", "turn_recall@20", "session_recall@5", "session_recall@10",
                 "turn_ndcg@10")
PLOT_RECALL = "recall_at_k.png"
PLOT_CATEGORY = "by_category.png"
CATEGORY_METRIC = "turn_recall@10"


def _pct(v: Any) -> str:
    return f"{100.0 * v:.1f}" if isinstance(v, (int, float)) else "–"


def format_table(metrics: dict[str, Any], columns: Sequence[str] = TABLE_METRICS) -> str:
    """Markdown table of strategies x metrics (percentages) with n and latency p50."""
    strategies = metrics.get("strategies", {})
    cols = [c for c in columns if any(c in s for s in strategies.values())] or list(columns)
    head = "| strategy | " + " | ".join(cols) + " | p50 ms | first query ms |"
    sep = "|---|" + "---|" * (len(cols) + 2)
    rows = [f"| {name} | " + " | ".join(_pct(s.get(c)) for c in cols)
            + f" | {s.get('latency_ms_p50', float('nan')):.1f} | {s.get('warmup_ms_max', float('nan')):.0f} |"
            for name, s in strategies.items()]
    title = (f"{metrics.get('dataset', '?')}: {metrics.get('n_questions', 0)} questions "
             f"({metrics.get('n_excluded_malformed', 0)} excluded: no valid evidence)")
    return "\n".join([title, "", head, sep, *rows])


LME_COLUMNS = ("lme_session_recall_all@5", "lme_session_ndcg_any@5", "lme_session_recall_all@10",
               "lme_session_ndcg_any@10", "lme_turn_recall_all@5", "lme_turn_ndcg_any@5", "lme_turn_recall_all@10",
               "lme_turn_ndcg_any@10", "lme_turn_recall_all@50", "lme_turn_ndcg_any@50")
LME_EASY_COLUMNS = ("lme_session_recall_any@5", "lme_session_recall_any@10", "lme_turn_recall_any@5",
                    "lme_turn_recall_any@10")
LME_TYPE_METRICS = ("lme_session_recall_all@5", "lme_turn_recall_all@10", "turn_recall@5")


def _short(col: str) -> str:
    return col.removeprefix("lme_").replace("session_", "sess ").replace("turn_", "turn ")


def lme_table(metrics: dict[str, Any]) -> str:
    """LongMemEval's own metrics per strategy (empty when the run has none), then recall_any,
    labelled as the easier metric, and the main figures per question type."""
    strategies = metrics.get("strategies", {})
    if not any(LME_COLUMNS[0] in s for s in strategies.values()):
        return ""
    note = (f"LongMemEval metrics as the benchmark computes them ({metrics.get('n_questions', 0)} questions; "
            f"{metrics.get('n_excluded_abstention', 0)} abstention questions excluded; definitions in "
            "memlib/eval/lme.py)")
    parts = [note, "", _grid(strategies, LME_COLUMNS), "",
             "recall_any@k (easier: one evidence item suffices; what most memory projects report):", "",
             _grid(strategies, LME_EASY_COLUMNS), ""]
    types = sorted({c for s in strategies.values() for c in s.get("by_category", {})})
    for metric in LME_TYPE_METRICS:
        head = f"| {_short(metric)} by question type | " + " | ".join(types) + " |"
        rows = [f"| {n} | " + " | ".join(_pct(s.get("by_category", {}).get(t, {}).get(metric)) for t in types) + " |"
                for n, s in strategies.items()]
        parts += [head, "|---|" + "---|" * len(types), *rows, ""]
    return "\n".join(parts)


def _grid(strategies: dict[str, Any], cols: Sequence[str]) -> str:
    head = "| strategy | " + " | ".join(_short(c) for c in cols) + " |"
    rows = [f"| {n} | " + " | ".join(_pct(s.get(c)) for c in cols) + " |" for n, s in strategies.items()]
    return "\n".join([head, "|---|" + "---|" * len(cols), *rows])


def _category_table(metrics: dict[str, Any], metric: str = CATEGORY_METRIC) -> str:
    strategies = metrics.get("strategies", {})
    cats = sorted({c for s in strategies.values() for c in s.get("by_category", {})})
    if not cats:
        return ""
    head = f"| strategy ({metric}) | " + " | ".join(f"cat {c}" for c in cats) + " |"
    sep = "|---|" + "---|" * len(cats)
    rows = [f"| {n} | " + " | ".join(_pct(s.get("by_category", {}).get(c, {}).get(metric)) for c in cats) + " |"
            for n, s in strategies.items()]
    return "\n".join([head, sep, *rows])


def _adversarial_table(metrics: dict[str, Any]) -> str:
    rows = [(n, s["adversarial"]) for n, s in metrics.get("strategies", {}).items() if "adversarial" in s]
    if not rows:
        return ""
    out = ["| strategy | n | turn_recall@10 | session_recall@10 |", "|---|---|---|---|"]
    out += [f"| {n} | {a['n_questions']} | {_pct(a.get('turn_recall@10'))} | {_pct(a.get('session_recall@10'))} |"
            for n, a in rows]
    return "\n".join(out)


def plot_recall_curves(metrics: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = metrics.get("ks", [])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, prefix in zip(axes, ("turn_recall", "session_recall")):
        for name, s in metrics.get("strategies", {}).items():
            ax.plot(ks, [100 * s.get(f"{prefix}@{k}", 0.0) for k in ks], marker="o", label=name)
        ax.set_xlabel("k")
        ax.set_ylabel(f"{prefix}@k (%)")
        ax.set_xscale("log")
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"{metrics.get('dataset', '')}: {metrics.get('n_questions', 0)} questions")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_categories(metrics: dict[str, Any], path: Path, metric: str = CATEGORY_METRIC) -> Path:
    import matplotlib.pyplot as plt

    fig = category_figure(metrics, metric)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def category_figure(metrics: dict[str, Any], metric: str = CATEGORY_METRIC):
    """The bars of ``metric`` per category and strategy, the legend right of the axes: inside them
    it covered the first bars whenever every bar was tall (a good strategy's chart)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    strategies = metrics.get("strategies", {})
    cats = sorted({c for s in strategies.values() for c in s.get("by_category", {})}) or ["all"]
    width = 0.8 / max(len(strategies), 1)
    x = np.arange(len(cats))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cats) + 3), 4))
    for i, (name, s) in enumerate(strategies.items()):
        vals = [100 * s.get("by_category", {}).get(c, {}).get(metric, 0.0) for c in cats]
        ax.bar(x + i * width, vals, width, label=name)
    ax.set_xticks(x + width * (len(strategies) - 1) / 2, cats, rotation=20)
    ax.set_ylabel(f"{metric} (%)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def failed_lines(metrics: dict[str, Any]) -> list[str]:
    """One line per strategy that failed (not scored), then a blank line; none when all ran."""
    failed = metrics.get("failed") or {}
    lines = [f"- strategy `{name}` failed, not scored: tenant {f['tenant_id']}, question {f['question_id']}: "
             f"{f['error']}" for name, f in failed.items()]
    return [*lines, ""] if lines else []


def report_markdown(metrics: dict[str, Any]) -> str:
    parts = [f"# Retrieval evaluation: {metrics.get('dataset')}", "",
             f"Store `{metrics.get('store')}` version {metrics.get('store_version')}. "
             f"{metrics.get('n_input_questions', 0)} input questions; {metrics.get('n_questions', 0)} scored, "
             f"{metrics.get('n_adversarial', 0)} adversarial (reported apart), "
             f"{metrics.get('n_excluded_malformed', 0)} excluded for having no valid evidence id, "
             f"{metrics.get('n_excluded_abstention', 0)} abstention questions excluded.", "",
             *failed_lines(metrics),
             "## Overall", "", format_table(metrics), "",
             "## Per category", "", _category_table(metrics), ""]
    lme = lme_table(metrics)
    if lme:
        parts += ["## LongMemEval metrics", "", lme, ""]
    adv = _adversarial_table(metrics)
    if adv:
        parts += ["## Adversarial (LoCoMo category 5)", "", adv, ""]
    parts += [f"![recall@k]({PLOT_RECALL})", "", f"![by category]({PLOT_CATEGORY})", "",
              "Protocol: see memlib/eval/metrics.py (turn recall is fractional over evidence turns; "
              "ranked nodes expand to source turns via provenance, de-duplicated in rank order).", ""]
    return "\n".join(parts)


def write_report(run: EvalRun, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"metrics": out / "metrics.json", "per_question": out / "per_question.parquet",
             "report": out / "report.md", "recall_plot": out / PLOT_RECALL, "category_plot": out / PLOT_CATEGORY}
    paths["metrics"].write_text(json.dumps(run.metrics, indent=2, sort_keys=False, default=str), encoding="utf-8")
    run.per_question.write_parquet(paths["per_question"])
    paths["report"].write_text(report_markdown(run.metrics), encoding="utf-8")
    plot_recall_curves(run.metrics, paths["recall_plot"])
    plot_categories(run.metrics, paths["category_plot"])
    return paths
