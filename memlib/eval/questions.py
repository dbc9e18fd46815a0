"""Which questions are scored, and with which evidence (see :mod:`memlib.eval.metrics`).

Questions come from the input file through memlib's readers (the same file the store was
built from) or from the store's ``questions`` table."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import polars as pl
import pyarrow as pa

from memlib.config import MemlibConfig
from memlib.io.store import StoreReader


class Dataset(str, Enum):
    LOCOMO = "locomo"
    LONGMEMEVAL = "longmemeval"
    JSONL = "jsonl"
    PARQUET = "parquet"
    STORE = "store"  # the store's own questions table, generic rules


class Group(str, Enum):
    OVERALL = "overall"
    ADVERSARIAL = "adversarial"  # LoCoMo category 5, reported separately


LOCOMO_SCORED = {"1", "2", "3", "4"}
LOCOMO_ADVERSARIAL = "5"
ABSTENTION_SUFFIX = "_abs"


@dataclass
class QuestionSet:
    dataset: Dataset
    # tenant_id, question_id, question, category, answer, question_time, evidence, evidence_sessions,
    # evidence_turn_sessions (the session of each evidence turn), group
    frame: pl.DataFrame
    n_input: int
    n_excluded_malformed: int    # no evidence id that exists in the conversation
    n_excluded_abstention: int
    n_dropped_evidence_ids: int  # evidence ids that match no turn of the conversation (all questions)

    def group(self, group: Group) -> pl.DataFrame:
        return self.frame.filter(pl.col("group") == group.value)

    def counts(self) -> dict[str, int]:
        return {"n_input_questions": self.n_input, "n_excluded_malformed": self.n_excluded_malformed,
                "n_excluded_abstention": self.n_excluded_abstention,
                "n_dropped_evidence_ids": self.n_dropped_evidence_ids}


def read_questions(path: str | Path, dataset: Dataset, cfg: MemlibConfig) -> pa.Table:
    """The questions table of an input file, read with memlib's readers (streamed per tenant)."""
    from memlib.io.readers import iter_tenants

    fmt = Dataset.JSONL.value if dataset is Dataset.STORE else dataset.value
    tables = [r.questions for r in iter_tenants(path, fmt, cfg.io)]
    return pa.concat_tables(tables, promote_options="permissive") if tables else pa.table({})


def store_questions(reader: StoreReader) -> pa.Table:
    return reader.table("questions")


def _turn_sessions(reader: StoreReader, tenants: list[str]) -> pl.DataFrame:
    parts = [pl.from_arrow(reader.table("turns", t, columns=["tenant_id", "turn_id", "session_id"]))
             for t in tenants if t in set(reader.tenants())]
    if not parts:
        return pl.DataFrame(schema={"tenant_id": pl.Utf8, "turn_id": pl.Utf8, "session_id": pl.Utf8})
    return pl.concat(parts)


def select_questions(questions: pa.Table | pl.DataFrame, reader: StoreReader, dataset: Dataset) -> QuestionSet:
    """Apply the protocol: valid evidence only, LoCoMo category 5 apart, LongMemEval ``_abs`` out."""
    q = questions if isinstance(questions, pl.DataFrame) else pl.from_arrow(questions)
    q = q.with_columns(pl.col("category").cast(pl.Utf8), pl.col("question_id").cast(pl.Utf8))
    n_input = q.height
    n_abs = 0
    if dataset is Dataset.LONGMEMEVAL:
        is_abs = pl.col("question_id").str.ends_with(ABSTENTION_SUFFIX)
        n_abs = q.filter(is_abs).height
        q = q.filter(~is_abs)
    turns = _turn_sessions(reader, q.get_column("tenant_id").unique().to_list())
    ev = (q.select("tenant_id", "question_id", pl.col("evidence").alias("turn_id")).explode("turn_id")
          .drop_nulls("turn_id"))
    n_ev_ids = ev.height
    valid = ev.join(turns, on=["tenant_id", "turn_id"], how="inner")
    aligned = valid.unique(subset=["tenant_id", "question_id", "turn_id"], maintain_order=True)
    agg = aligned.group_by(["tenant_id", "question_id"], maintain_order=True).agg(
        pl.col("turn_id").alias("valid_evidence"),
        pl.col("session_id").unique(maintain_order=True).alias("turn_sessions"),
        pl.col("session_id").alias("evidence_turn_sessions"))
    q = q.join(agg, on=["tenant_id", "question_id"], how="left")
    has_ev = pl.col("valid_evidence").list.len().fill_null(0) > 0
    n_malformed = q.filter(~has_ev).height
    q = q.filter(has_ev)
    n_dropped = n_ev_ids - valid.height
    sessions = (pl.col("evidence_sessions") if dataset is Dataset.LONGMEMEVAL else pl.col("turn_sessions"))
    group = (pl.when(pl.col("category") == LOCOMO_ADVERSARIAL).then(pl.lit(Group.ADVERSARIAL.value))
             .otherwise(pl.lit(Group.OVERALL.value)) if dataset is Dataset.LOCOMO else pl.lit(Group.OVERALL.value))
    extra = [pl.col(c) if c in q.columns else pl.lit(None).alias(c) for c in ("answer", "question_time")]
    frame = q.select("tenant_id", "question_id", "question", "category", *extra,
                     pl.col("valid_evidence").alias("evidence"), sessions.alias("evidence_sessions"),
                     "evidence_turn_sessions", group.alias("group"))
    if dataset is Dataset.LOCOMO:
        frame = frame.filter(pl.col("category").is_in(sorted(LOCOMO_SCORED | {LOCOMO_ADVERSARIAL})))
    return QuestionSet(dataset, frame, n_input, n_malformed, n_abs, max(n_dropped, 0))
