"""Heuristic fallback of failed units must see only its own turns, whatever ran before it on the
same worker (regression: the parsed-turn cache lived in the worker-wide ``extras`` dict, so a
fallback reused the parse of the first unit/tenant that filled it and lost its own rows)."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from memlib import schema
from memlib.compose.reference import sort_turns
from memlib.config import MemlibConfig
from memlib.extract.base import Extraction, ExtractionContext
from memlib.extract.llm_common import CLIENT_KEY, fallback, make_units
from memlib.io.readers import read_input
from memlib.llm.models import Task

SAMPLE = Path(__file__).resolve().parents[2] / "memlib" / "data" / "sample_conversations.jsonl"


@pytest.fixture(scope="module")
def tenant_turns() -> dict[str, pa.Table]:
    turns = sort_turns(schema.conform(read_input(SAMPLE, "jsonl").turns, schema.TURNS, name="turns"))
    tenants = sorted(set(turns.column("tenant_id").to_pylist()))
    assert len(tenants) >= 2
    return {t: turns.filter(pc.equal(turns.column("tenant_id"), t)) for t in tenants}


def _rows(ctx: ExtractionContext, stage: Extraction, task: Task, unit_index: int) -> set[str]:
    unit = make_units(ctx.kept_turns(), ctx.config.llm.turns_per_call, task)[unit_index]
    return set(fallback(ctx, stage, [unit]).nodes.column("node_id").to_pylist())


@pytest.mark.parametrize("stage,task", [(Extraction.TRIPLETS, Task.TRIPLETS), (Extraction.FACTS, Task.FACTS)])
def test_fallback_rows_do_not_depend_on_earlier_fallbacks(tenant_turns, stage, task):
    cfg = MemlibConfig()
    shared = {CLIENT_KEY: object()}  # a worker-wide extras dict, as a build actor holds it
    order = list(tenant_turns)
    alone = {t: _rows(ExtractionContext(turns=tenant_turns[t], config=cfg), stage, task, -1) for t in order}
    assert all(alone.values()), {t: len(v) for t, v in alone.items()}
    for t in order:  # every tenant's last unit fails, one after the other, on the same worker
        ctx = ExtractionContext(turns=tenant_turns[t], config=cfg, extras=shared)
        first = _rows(ctx, stage, task, 0)
        assert first, t
        assert _rows(ctx, stage, task, -1) == alone[t], t
    assert set(shared) == {CLIENT_KEY}, "a fallback left per-context state in the worker's extras"

