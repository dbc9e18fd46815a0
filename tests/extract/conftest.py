"""Hand-built TURNS tables for extraction tests (no dependency on the readers)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from memlib import schema
from memlib.config import MemlibConfig
from memlib.extract.base import ExtractionContext
from memlib.ids import content_hash, turn_node_id

S1 = datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)

SESSIONS = [
    (S1, [("Caroline", "Yesterday I went to my pottery class with Melanie."),
          ("Melanie", "Hey! How was it?"),
          ("Caroline", "I love pottery classes. Boston has a great studio."),
          ("Melanie", "Thanks!")]),
    (S1 + timedelta(days=30), [("Caroline", "I signed up for another pottery class last week."),
                               ("Melanie", "Caroline, you are so talented! I visited Paris in 2022.")]),
    (S1 + timedelta(days=60), [("Caroline", "My pottery class teacher praised my bowl. I met Jonas at Google."),
                               ("Melanie", "Cool.")]),
]


def make_turns(tenant: str = "t1", conv: str = "c1") -> pa.Table:
    rows = []
    for si, (when, turns) in enumerate(SESSIONS, start=1):
        for ti, (speaker, text) in enumerate(turns, start=1):
            tid = f"D{si}:{ti}"
            rows.append({"tenant_id": tenant, "conversation_id": conv, "session_id": f"session_{si}",
                         "session_index": si, "session_time": when, "turn_id": tid, "turn_index": ti,
                         "node_id": turn_node_id(tenant, conv, tid), "speaker": speaker, "role": "user",
                         "text": text, "content_hash": content_hash(text), "extras": None})
    return schema.conform(pa.Table.from_pylist(rows), schema.TURNS, name="turns")


@pytest.fixture
def turns() -> pa.Table:
    return make_turns()


@pytest.fixture
def kept_ids(turns: pa.Table) -> frozenset[str]:
    phatic = {"Hey! How was it?", "Thanks!", "Cool."}
    return frozenset(r["node_id"] for r in turns.to_pylist() if r["text"] not in phatic)


@pytest.fixture
def ctx(turns: pa.Table, kept_ids: frozenset[str]) -> ExtractionContext:
    return ExtractionContext(turns=turns, kept_turn_ids=kept_ids, config=MemlibConfig())
