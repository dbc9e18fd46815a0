"""Shared machinery of the LLM extraction backends: units, prompts, calls, fallback.

A *unit* is up to ``cfg.llm.turns_per_call`` consecutive kept turns of one session; one
call per unit and task. Units whose call failed are re-extracted by the stage's heuristic
backend (rows marked ``source=heuristic-fallback``); the failure stays recorded in
``llm_calls`` and, since failed calls are never cached, a rerun calls the model again for
exactly those units.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from memlib.config import Backend
from memlib.extract.base import Extraction, ExtractionContext, ExtractResult, UnknownExtractorError, get_extractor
from memlib.ids import make_id
from memlib.llm.client import CallResult, LLMClient
from memlib.llm.estimate import PlannedCall
from memlib.llm.models import Task
from memlib.schema import Source

CLIENT_KEY = "llm_client"
CACHE_DIR_KEY = "llm_cache_dir"
LIMITER_KEY = "llm_limiter"
HANDLE_KEYS = (CLIENT_KEY, CACHE_DIR_KEY, LIMITER_KEY)  # worker-scoped handles; every other extras key is per context
MAX_TEXT = 600  # characters of one turn shown to the model


@dataclass(frozen=True)
class Unit:
    unit_id: str
    tenant_id: str
    conversation_id: str
    session_id: str
    session_time: datetime | None
    turn_node_ids: tuple[str, ...]
    lines: str

    def turns_at(self, indices: Sequence[int]) -> list[str]:
        """Turn node ids of the (valid, de-duplicated) prompt indices."""
        seen = dict.fromkeys(i for i in indices if 0 <= i < len(self.turn_node_ids))
        return [self.turn_node_ids[i] for i in seen]

    @property
    def session_date(self) -> str:
        return self.session_time.strftime("%Y-%m-%d (%A)") if self.session_time else "unknown"


def _line(i: int, speaker: str | None, text: str) -> str:
    text = " ".join(text.split())
    text = text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"
    return f"[{i}] {speaker or '?'}: {text}"


def make_units(turns: pa.Table, per_call: int, task: Task) -> list[Unit]:
    """Chunk ordered turns into units of at most ``per_call`` turns of one session."""
    if turns.num_rows == 0:
        return []
    keys = ["tenant_id", "conversation_id", "session_id"]
    df = (pl.from_arrow(turns.select(keys + ["session_index", "session_time", "turn_index", "node_id",
                                             "speaker", "text"]))
          .sort(["tenant_id", "conversation_id", "session_index", "turn_index"])
          .with_columns((pl.int_range(pl.len()).over(keys) // max(1, per_call)).alias("_chunk")))
    grouped = df.group_by(keys + ["_chunk"], maintain_order=True).agg(
        pl.col("session_time").first(), pl.col("node_id"), pl.col("speaker"), pl.col("text"))
    units = []
    for r in grouped.iter_rows(named=True):
        lines = "\n".join(_line(i, s, t) for i, (s, t) in enumerate(zip(r["speaker"], r["text"])))
        ids = tuple(r["node_id"])
        units.append(Unit(make_id("llmunit", task.value, r["tenant_id"], *ids), r["tenant_id"],
                          r["conversation_id"], r["session_id"], r["session_time"], ids, lines))
    return units


def client_of(ctx: ExtractionContext) -> LLMClient:
    """The run's client (built once per worker by the caller), else one built from config."""
    client = ctx.extras.get(CLIENT_KEY)
    if client is None:
        client = LLMClient(ctx.config.llm, cache_dir=ctx.extras.get(CACHE_DIR_KEY),
                           limiter=ctx.extras.get(LIMITER_KEY))
        ctx.extras[CLIENT_KEY] = client
    return client


Variables = Callable[[Unit], dict[str, str]]


def call_units(client: LLMClient, task: Task, units: list[Unit], variables: Variables,
               concurrency: int) -> list[CallResult]:
    """One call per unit with bounded concurrency; results in unit order."""
    def one(u: Unit) -> CallResult:
        return client.call(task, variables(u), unit_id=u.unit_id, tenant_id=u.tenant_id)
    if concurrency <= 1 or len(units) <= 1:
        return [one(u) for u in units]
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, units))


def plan_units(client: LLMClient, task: Task, units: list[Unit], variables: Variables) -> list[PlannedCall]:
    """The calls :func:`call_units` would make, rendered but not sent (dry run)."""
    return [PlannedCall(task, u.unit_id, client.messages(task, variables(u))) for u in units]


def fallback(ctx: ExtractionContext, stage: Extraction, failed: list[Unit]) -> ExtractResult:
    """Heuristic extraction of the failed units' turns, rows marked heuristic-fallback."""
    if not failed:
        return ExtractResult()
    try:
        heuristic = get_extractor(stage, Backend.HEURISTIC)
    except UnknownExtractorError:
        return ExtractResult()
    ids = sorted({t for u in failed for t in u.turn_node_ids})
    turns = ctx.turns.filter(pc.is_in(ctx.turns.column("node_id"), value_set=pa.array(ids, pa.string())))
    sub = ExtractionContext(turns=turns, kept_turn_ids=None, config=ctx.config, nlp=ctx.nlp,
                            facts=_facts_of(ctx.facts, ids), extras=handles_of(ctx))
    res = heuristic.run(sub).conformed(f"{stage.value}.fallback")
    ctx.nlp = sub.nlp
    return ExtractResult(mark_source(res.nodes, Source.HEURISTIC_FALLBACK.value), res.edges)


def handles_of(ctx: ExtractionContext) -> dict[str, Any]:
    """A fresh extras dict holding only ``ctx``'s worker-scoped handles. A sub-context over other
    turns must not share per-context caches (e.g. the parsed-turn cache of memlib.extract.parse,
    which would hand it the parse of whichever turn set filled it first, and vice versa)."""
    return {k: ctx.extras[k] for k in HANDLE_KEYS if k in ctx.extras}


def _facts_of(facts: pa.Table | None, turn_ids: list[str]) -> pa.Table | None:
    """Facts derived from any of ``turn_ids`` (what a fallback of those turns may read)."""
    if facts is None or facts.num_rows == 0:
        return facts
    hit = (pl.from_arrow(facts.select(["node_id", "provenance"])).explode("provenance")
           .filter(pl.col("provenance").is_in(turn_ids))["node_id"].unique())
    return facts.filter(pc.is_in(facts.column("node_id"), value_set=hit.to_arrow()))


def mark_source(nodes: pa.Table, source: str, prompt_version: str | None = None) -> pa.Table:
    n = nodes.num_rows
    nodes = nodes.set_column(nodes.schema.get_field_index("source"), "source",
                             pa.array([source] * n, pa.string()))
    if prompt_version is not None:
        nodes = nodes.set_column(nodes.schema.get_field_index("prompt_version"), "prompt_version",
                                 pa.array([prompt_version] * n, pa.string()))
    return nodes


def numbered(texts: Sequence[str], empty: str = "(none)") -> str:
    return "\n".join(f"[{i}] {t}" for i, t in enumerate(texts)) or empty


def run_stage(ctx: ExtractionContext, stage: Extraction, task: Task, variables: Variables,
              convert: Callable[[Unit, Any, str], ExtractResult]) -> ExtractResult:
    """Units -> calls -> converted results; failed units -> heuristic fallback."""
    client = client_of(ctx)
    units = make_units(ctx.kept_turns(), ctx.config.llm.turns_per_call, task)
    results = call_units(client, task, units, variables, ctx.config.llm.concurrency)
    parts, failed = [], []
    for unit, res in zip(units, results):
        if res.ok:
            part = convert(unit, res.output, ctx.config.llm.model).conformed(stage.value)
            parts.append(ExtractResult(mark_source(part.nodes, ctx.config.llm.model, res.prompt_version),
                                       part.edges))
        else:
            failed.append(unit)
    parts.append(fallback(ctx, stage, failed))
    return ExtractResult.concat(parts)
