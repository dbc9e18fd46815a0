"""One tenant read from several input files (a directory of daily exports): its tables merged as
if the files were one, earlier file first. Turns are validated again in that order, so a turn id
repeated across files keeps its first occurrence and quarantines the later one, sessions are
renumbered by time over all files, and a session continued in a later file keeps its turns in
file order."""
from __future__ import annotations

import polars as pl
import pyarrow as pa

from memlib import schema
from memlib.config import IOConfig
from memlib.io.builder import TenantBuilder
from memlib.io.result import ReadResult
from memlib.io.validate import parse_iso_time

_FIELDS = ("tenant_id", "conversation_id", "session_id", "session_time", "turn_id", "speaker", "role", "text",
           "extras")


def _ordered(turns: pa.Table) -> list[dict]:
    order = [("conversation_id", "ascending"), ("session_index", "ascending"), ("turn_index", "ascending")]
    return turns.sort_by(order).select(list(_FIELDS)).to_pylist()


def merge_tenant(earlier: ReadResult, later: ReadResult, source: str, cfg: IOConfig) -> ReadResult:
    """``earlier`` and ``later`` (the same tenant from two files) as one :class:`ReadResult`;
    its quarantine holds only the turns the merge rejected (each file's own rows stay its own)."""
    b = TenantBuilder(source, cfg, parse_iso_time, require_time=False)
    for rec in _ordered(earlier.turns):
        b.add_turn(rec, f"turn {rec['turn_id']} (earlier file)", rec)
    for rec in _ordered(later.turns):
        b.add_turn(rec, f"turn {rec['turn_id']}", rec)
    merged = b.result()
    questions = pa.concat_tables([schema.conform(earlier.questions, schema.QUESTIONS, name="questions"),
                                  schema.conform(later.questions, schema.QUESTIONS, name="questions")])
    if questions.num_rows:
        questions = schema.conform(pl.from_arrow(questions).unique(subset=["question_id"], keep="first",
                                                                   maintain_order=True).to_arrow(),
                                   schema.QUESTIONS, name="questions")
    return ReadResult(turns=merged.turns, questions=questions, quarantine=merged.quarantine)
