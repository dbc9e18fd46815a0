"""``ReadResult``: the turns, questions and quarantine rows read from one or more tenants."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema


@dataclass
class ReadResult:
    turns: pa.Table = field(default_factory=lambda: schema.empty(schema.TURNS))
    questions: pa.Table = field(default_factory=lambda: schema.empty(schema.QUESTIONS))
    quarantine: pa.Table = field(default_factory=lambda: schema.empty(schema.QUARANTINE))

    @classmethod
    def concat(cls, results: list[ReadResult]) -> ReadResult:
        if not results:
            return cls()
        return cls(
            turns=pa.concat_tables([r.turns for r in results]),
            questions=pa.concat_tables([r.questions for r in results]),
            quarantine=pa.concat_tables([r.quarantine for r in results]),
        )

    @property
    def tenant_ids(self) -> list[str]:
        """Every tenant with a turn or a question, in order of first appearance (turns first)."""
        chunks = [*self.turns.column("tenant_id").chunks, *self.questions.column("tenant_id").chunks]
        return pc.unique(pa.chunked_array(chunks, pa.string())).to_pylist()

    def summary(self) -> dict[str, Any]:
        """Counts for ``memlib inspect`` and build logs (JSON-able)."""
        turns = pl.from_arrow(self.turns.select(["tenant_id", "conversation_id", "session_id",
                                                 "session_time"]))
        quarantine = pl.from_arrow(self.quarantine.select(["reason_code"]))
        by_reason = (quarantine.group_by("reason_code").len().sort(["len", "reason_code"],
                                                                   descending=[True, False]))
        first, last = turns.get_column("session_time").min(), turns.get_column("session_time").max()
        return {
            "tenants": len(self.tenant_ids),
            "conversations": turns.select(["tenant_id", "conversation_id"]).n_unique() if len(turns) else 0,
            "sessions": (turns.select(["tenant_id", "conversation_id", "session_id"]).n_unique()
                         if len(turns) else 0),
            "turns": self.turns.num_rows,
            "questions": self.questions.num_rows,
            "first_session_time": first.isoformat() if first is not None else None,
            "last_session_time": last.isoformat() if last is not None else None,
            "quarantined": self.quarantine.num_rows,
            "quarantined_by_reason": dict(zip(by_reason.get_column("reason_code").to_list(),
                                              by_reason.get_column("len").to_list())),
        }


def combine_summaries(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Total of per-tenant :meth:`ReadResult.summary` dicts (tenants are disjoint)."""
    counts = ("tenants", "conversations", "sessions", "turns", "questions", "quarantined")
    total: dict[str, Any] = {k: sum(s[k] for s in summaries) for k in counts}
    firsts = [s["first_session_time"] for s in summaries if s["first_session_time"]]
    lasts = [s["last_session_time"] for s in summaries if s["last_session_time"]]
    total["first_session_time"] = min(firsts) if firsts else None
    total["last_session_time"] = max(lasts) if lasts else None
    reasons: dict[str, int] = {}
    for s in summaries:
        for code, n in s["quarantined_by_reason"].items():
            reasons[code] = reasons.get(code, 0) + n
    total["quarantined_by_reason"] = dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    return total
