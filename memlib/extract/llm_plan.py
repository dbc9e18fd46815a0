"""Dry-run planning: the calls the LLM stages would make, rendered but not sent.

Turn-level calls (facts, triplets, events) are rendered exactly from the units. Follow-up
calls depend on model output (outdated-fact checks per later session, causal links per
session, reflections per 40 facts), so they are rendered with placeholder text of the sizes
measured on LoCoMo with ``memlib bench llm``.
"""
from __future__ import annotations

import math

import polars as pl

from memlib.config import Backend
from memlib.extract.base import Extraction, ExtractionContext, backend_of, configured
from memlib.extract.llm_common import client_of, make_units, plan_units
from memlib.extract.llm_events import variables as event_vars
from memlib.extract.llm_facts import variables_for
from memlib.extract.llm_outdated import MAX_NEW, MAX_OLD
from memlib.extract.llm_reflections import FACTS_PER_CALL
from memlib.extract.llm_triplets import variables as triplet_vars
from memlib.llm.estimate import PlannedCall
from memlib.llm.models import Task

FACT_LINE_CHARS = 115     # measured mean of "[i] fact text" lines
EVENT_LINE_CHARS = 125
FACTS_PER_TURN = 1.0      # facts extracted per kept turn
EVENTS_PER_SESSION = 6.0


def _filler(n_lines: int, chars: int) -> str:
    return "\n".join(f"[{i}] " + "x" * max(1, chars - 5) for i in range(n_lines)) or "(none)"


def plan_calls(ctx: ExtractionContext) -> list[PlannedCall]:
    cfg, client = ctx.config, client_of(ctx)
    turns = ctx.kept_turns()
    per_call = cfg.llm.turns_per_call
    calls: list[PlannedCall] = []
    per_turn = {Extraction.FACTS: (Task.FACTS, variables_for(ctx)), Extraction.TRIPLETS: (Task.TRIPLETS, triplet_vars),
                Extraction.EVENTS: (Task.EVENTS, event_vars)}
    llm = {e for e in configured(cfg) if backend_of(cfg, e) is Backend.LLM}
    for extraction, (task, variables) in per_turn.items():
        if extraction in llm:
            calls += plan_units(client, task, make_units(turns, per_call, task), variables)
    sessions = (pl.from_arrow(turns.select(["tenant_id", "conversation_id", "session_id"]))
                .group_by(["tenant_id", "conversation_id", "session_id"]).len())
    per_conv = sessions.group_by("conversation_id").agg(pl.len().alias("n"), pl.col("len").sum().alias("turns"))
    if Extraction.FACTS in llm:
        n_new = min(MAX_NEW, round(FACTS_PER_TURN * sessions["len"].mean())) if sessions.height else 0
        msg = client.messages(Task.OUTDATED, {"new_facts": _filler(n_new, FACT_LINE_CHARS),
                                              "old_facts": _filler(MAX_OLD, FACT_LINE_CHARS + 13)})
        later = sessions.height - per_conv.height
        calls += [PlannedCall(Task.OUTDATED, f"outdated-{i}", msg) for i in range(max(0, later))]
    if Extraction.EVENTS in llm:
        msg = client.messages(Task.CAUSAL, {"events": _filler(8, EVENT_LINE_CHARS)})
        calls += [PlannedCall(Task.CAUSAL, f"causal-{i}", msg) for i in range(sessions.height)]
    if Extraction.REFLECTIONS in llm:
        for conv, n_turns in zip(per_conv["conversation_id"], per_conv["turns"]):
            n_facts = FACTS_PER_TURN * n_turns
            for j in range(math.ceil(n_facts / FACTS_PER_CALL)):
                k = int(min(FACTS_PER_CALL, n_facts - j * FACTS_PER_CALL))
                msg = client.messages(Task.REFLECTIONS, {"facts": _filler(k, FACT_LINE_CHARS),
                                                         "existing_reflections": "(none)"})
                calls.append(PlannedCall(Task.REFLECTIONS, f"reflections-{conv}-{j}", msg))
    return calls
