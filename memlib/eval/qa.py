"""Optional QA scoring: answer from the packed context, then an LLM judge grades key-fact
coverage (GAAMA). Runs only when an OpenAI-compatible endpoint (``llm.base_url``) and an
answer model are configured; every call goes through memlib.llm's one call path."""
from __future__ import annotations

import re
from typing import Any

import polars as pl

from memlib.config import MemlibConfig

_FACT_SPLIT = re.compile(r"\s*;\s*|\n+")


def key_facts(reference: Any) -> list[str]:
    """Reference answer -> numbered key facts (split on ';' and newlines)."""
    text = "" if reference is None else str(reference)
    return [f for f in _FACT_SPLIT.split(text) if f.strip()] or [text]


def _client(cfg: MemlibConfig, model: str):
    from memlib.llm.client import LLMClient

    return LLMClient(cfg.llm.model_copy(update={"model": model}))


def _score_row(answerer, judge, row: dict[str, Any]) -> dict[str, Any]:
    from memlib.llm.models import Task

    unit = f"{row['strategy']}:{row['tenant_id']}:{row['question_id']}"
    qdate = row.get("question_time")
    ans = answerer.call(Task.ANSWER, {"question": row["question"], "context": row["context"] or "",
                                      "question_date": str(qdate) if qdate is not None else "unknown"},
                        unit_id=unit, tenant_id=row["tenant_id"])
    if not ans.ok:
        return {"qa_answer": None, "qa_coverage": None, "qa_correct": None, "qa_error": ans.error}
    facts = key_facts(row.get("answer"))
    numbered = "\n".join(f"{i}. {f}" for i, f in enumerate(facts))
    verdict = judge.call(Task.JUDGE, {"question": row["question"], "key_facts": numbered,
                                      "answer": ans.output.answer}, unit_id=unit, tenant_id=row["tenant_id"])
    if not verdict.ok:
        return {"qa_answer": ans.output.answer, "qa_coverage": None, "qa_correct": None, "qa_error": verdict.error}
    covered = {i for i in verdict.output.covered if 0 <= i < len(facts)}
    return {"qa_answer": ans.output.answer, "qa_coverage": len(covered) / len(facts),
            "qa_correct": bool(verdict.output.correct), "qa_error": None}


def maybe_score_qa(run, cfg: MemlibConfig, answer_model: str | None, judge_model: str | None) -> str | None:
    """Add qa_* columns to ``run.per_question`` and qa means to ``run.metrics``.
    Returns a one-line note (what was done or why it was skipped); None when not requested."""
    if not answer_model and not judge_model:
        return None
    if not cfg.llm.base_url:
        return "QA scoring skipped: no OpenAI-compatible endpoint configured (set llm.base_url)"
    answerer = _client(cfg, answer_model or cfg.llm.model)
    judge = _client(cfg, judge_model or answer_model or cfg.llm.model)
    rows = [_score_row(answerer, judge, r) for r in run.per_question.iter_rows(named=True)]
    qa = pl.DataFrame(rows, schema={"qa_answer": pl.Utf8, "qa_coverage": pl.Float64, "qa_correct": pl.Boolean,
                                    "qa_error": pl.Utf8})
    run.per_question = pl.concat([run.per_question, qa], how="horizontal")
    scored = run.per_question.filter(pl.col("group") == "overall")
    for name, block in scored.group_by("strategy"):
        stats = block.select(pl.col("qa_coverage").mean(), pl.col("qa_correct").cast(pl.Float64).mean(),
                             pl.col("qa_error").is_not_null().sum().alias("qa_errors")).row(0, named=True)
        run.metrics["strategies"][name[0]].update(stats)
    n_err = int(run.per_question.get_column("qa_error").is_not_null().sum())
    return f"QA scored {len(rows)} answers ({n_err} failed calls recorded in per_question.parquet)"
