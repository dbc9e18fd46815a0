"""Scale corpora from real sessions: a LongMemEval-l-sized haystack around one LoCoMo conversation,
or many LoCoMo-sized tenants, written as generic JSONL (memlib/io/FORMAT.md).

The evaluated conversation keeps its own sessions, turn ids and questions unchanged (so the
evidence ids stay valid). Every other session is a *copy of another conversation's session*
(the other LoCoMo conversations, the LongMemEval haystack sessions), re-dated to a random day
around the evaluated conversation and re-named (LoCoMo speaker names replaced in speaker and
text by names the evaluated conversation does not use), with fresh session and turn ids.
The evaluated conversation's own sessions are never copied.

The copy plan is drawn for :attr:`HaystackSpec.plan_size` copies and cut to the size asked, so
with one seed a smaller haystack's distractors are a prefix of a larger one's (same copies, ids
and dates): 50, 500 and 2,500 sessions are nested, and a larger store can be built from a
smaller one with ``memlib build --incremental``. When the haystack needs more copies than the
pool has sessions, every source session is used once before any is used twice (rounds of
permutations); :func:`filler_summary` says how many copies reuse a source.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import polars as pl

from memlib.config import IOConfig
from memlib.io.readers import read_input

NAMES = ["Avery", "Bruno", "Celine", "Dario", "Elif", "Farah", "Goran", "Hana", "Ivo", "Jonas", "Kira", "Lior",
         "Mina", "Nadia", "Otto", "Priya", "Quinn", "Rafael", "Sven", "Tamsin", "Umar", "Vera", "Wendell", "Yara"]
TURN_COLUMNS = ["tenant_id", "conversation_id", "session_id", "session_time", "turn_id", "speaker", "role", "text"]
NAME_VARIANTS = 8


@dataclass(frozen=True)
class HaystackSpec:
    sessions: int = 2500        # LongMemEval-l: ~2,500 sessions (~24k turns here) per tenant
    seed: int = 0
    span_days: int = 720        # distractor dates fall within this many days before the conversation ends
    plan_size: int = 2500       # copies drawn before the cut: smaller haystacks are prefixes of larger ones


@dataclass
class Pool:
    """Source turns (generic columns) and LoCoMo questions."""
    turns: pl.DataFrame
    questions: pl.DataFrame

    @classmethod
    def load(cls, locomo: Path, longmemeval: list[Path], io: IOConfig | None = None) -> Pool:
        io = io or IOConfig()
        lo = read_input(locomo, "locomo", io)
        frames = [pl.from_arrow(lo.turns.select(TURN_COLUMNS)).with_columns(pl.lit("locomo").alias("origin"))]
        for path in longmemeval:
            lme = pl.from_arrow(read_input(path, "longmemeval", io).turns.select(TURN_COLUMNS))
            # the haystacks share sessions: keep one copy of each session id
            lme = lme.unique(subset=["session_id", "turn_id"], keep="first", maintain_order=True)
            frames.append(lme.with_columns(pl.lit("longmemeval").alias("origin"),
                                           pl.lit("lme").alias("conversation_id")))
        turns = pl.concat(frames).unique(subset=["conversation_id", "session_id", "turn_id"], keep="first",
                                         maintain_order=True)
        return cls(turns=turns, questions=pl.from_arrow(lo.questions))

    def conversations(self) -> list[str]:
        return self.turns.filter(pl.col("origin") == "locomo").get_column("conversation_id").unique(
            maintain_order=True).to_list()


def _sessions(turns: pl.DataFrame) -> pl.DataFrame:
    return turns.select("conversation_id", "session_id").unique(maintain_order=True)


def _copy_plan(pool: pl.DataFrame, n: int, end, spec: HaystackSpec, rng: np.random.Generator) -> pl.DataFrame:
    """One row per distractor copy: source session, copy id, new date, name variant."""
    sessions = _sessions(pool)
    size = max(n, spec.plan_size)
    rounds = max(1, -(-size // max(sessions.height, 1)))
    order = np.concatenate([rng.permutation(sessions.height) for _ in range(rounds)])[:size][:n]
    days = rng.integers(0, spec.span_days, size=size)[:n]
    minutes = rng.integers(8 * 60, 22 * 60, size=size)[:n]
    return sessions[order].with_columns(
        pl.Series("copy", np.arange(n), dtype=pl.Int64),
        pl.Series("new_time", [end - timedelta(days=int(d)) for d in days]).dt.truncate("1d")
        + pl.duration(minutes=pl.Series(minutes)),
        pl.Series("variant", np.arange(n) % NAME_VARIANTS, dtype=pl.Int64),
    )


def _rename(df: pl.DataFrame, avoid: set[str]) -> pl.DataFrame:
    """Replace LoCoMo speaker names (speaker and text) per source conversation and name variant."""
    names = [n for n in NAMES if n not in avoid]
    parts = []
    for (_conv, variant), part in df.group_by(["conversation_id", "variant"], maintain_order=True):
        speakers = sorted(set(part.filter(pl.col("origin") == "locomo").get_column("speaker").to_list()))
        if not speakers:
            parts.append(part)
            continue
        new = [names[(variant * 3 + i) % len(names)] for i in range(len(speakers))]
        parts.append(part.with_columns(pl.col("speaker").replace(speakers, new),
                                       pl.col("text").str.replace_many(speakers, new)))
    return pl.concat(parts) if parts else df


def _plan_for(pool: Pool, conversation: str, spec: HaystackSpec) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    own = pool.turns.filter(pl.col("conversation_id") == conversation)
    others = pool.turns.filter(pl.col("conversation_id") != conversation)
    return own, others, max(0, spec.sessions - _sessions(own).height)


def filler_summary(pool: Pool, conversation: str, spec: HaystackSpec) -> dict:
    """Where the distractor sessions of :func:`compose_haystack` come from: copies per origin
    (``locomo``: the other LoCoMo conversations, ``longmemeval``: the LongMemEval haystack
    sessions), distinct source sessions, and how many copies repeat a source already copied."""
    own, others, n = _plan_for(pool, conversation, spec)
    if n == 0:
        return {"filler_copies": 0}
    plan = _copy_plan(others, n, own.get_column("session_time").max(), spec, np.random.default_rng(spec.seed))
    origin = others.select("conversation_id", "session_id", "origin").unique(subset=["conversation_id", "session_id"])
    plan = plan.join(origin, on=["conversation_id", "session_id"], how="left")
    distinct = plan.select("conversation_id", "session_id").n_unique()
    by_origin = plan.group_by("origin").len().sort("origin")
    return {"filler_copies": plan.height, "filler_distinct_sources": distinct,
            "filler_pool_sessions": _sessions(others).height, "filler_repeated_copies": plan.height - distinct,
            "filler_by_origin": dict(zip(by_origin.get_column("origin").to_list(),
                                         by_origin.get_column("len").to_list()))}


def compose_haystack(pool: Pool, conversation: str, tenant: str,
                     spec: HaystackSpec) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(turns, questions) of ``tenant``: the conversation plus distractor copies up to ``spec.sessions``."""
    rng = np.random.default_rng(spec.seed)
    own, others, n = _plan_for(pool, conversation, spec)
    questions = pool.questions.filter(pl.col("tenant_id") == conversation).with_columns(
        pl.lit(tenant).alias("tenant_id"), (pl.lit(tenant + ":") + pl.col("question_id")).alias("question_id"))
    if n == 0:
        return own.select(TURN_COLUMNS).with_columns(pl.lit(tenant).alias("tenant_id")), questions
    plan = _copy_plan(others, n, own.get_column("session_time").max(), spec, rng)
    copies = others.join(plan, on=["conversation_id", "session_id"], how="inner")
    copies = _rename(copies, set(own.get_column("speaker").unique().to_list()))
    copies = copies.with_columns(
        pl.format("x{}", pl.col("copy")).alias("session_id"),
        pl.format("x{}:{}", pl.col("copy"), pl.int_range(pl.len()).over("copy")).alias("turn_id"),
        pl.format("hay-{}", pl.col("copy") // 50).alias("conversation_id"),
        pl.col("new_time").alias("session_time"),
    ).sort(["session_time", "copy"])
    turns = pl.concat([own.select(TURN_COLUMNS), copies.select(TURN_COLUMNS)]).with_columns(
        pl.lit(tenant).alias("tenant_id"))
    return turns, questions


def write_jsonl(path: Path, turns: list[pl.DataFrame], questions: list[pl.DataFrame]) -> dict[str, int]:
    """Generic JSONL: turn lines grouped by tenant, then ``"kind": "question"`` lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    t = pl.concat(turns).with_columns(pl.col("session_time").dt.to_string("%Y-%m-%dT%H:%M:%S+00:00"),
                                      pl.lit("turn").alias("kind"))
    q = pl.concat(questions) if questions else pl.DataFrame()
    with open(path, "wb") as fh:
        t.write_ndjson(fh)
        if q.height:
            q.drop([c for c in ("question_time",) if c in q.columns]).with_columns(
                pl.lit("question").alias("kind")).write_ndjson(fh)
    return {"tenants": t.get_column("tenant_id").n_unique(), "turns": t.height,
            "sessions": t.select("tenant_id", "conversation_id", "session_id").n_unique(), "questions": q.height}


def many_tenants(pool: Pool, n_tenants: int, spec: HaystackSpec) -> tuple[list[pl.DataFrame], list[pl.DataFrame]]:
    """The LoCoMo conversations as themselves, then LoCoMo-sized tenants of re-dated, re-named copies."""
    convs = pool.conversations()
    turns, questions = [], []
    for conv in convs[:n_tenants]:
        t, q = compose_haystack(pool, conv, conv, HaystackSpec(sessions=0, seed=spec.seed))
        turns.append(t)
        questions.append(q.with_columns(pl.lit(conv).alias("tenant_id")))
    size = int(np.median([_sessions(pool.turns.filter(pl.col("conversation_id") == c)).height for c in convs]))
    for i in range(len(turns), n_tenants):
        src = convs[i % len(convs)]
        own = _sessions(pool.turns.filter(pl.col("conversation_id") == src)).height
        t, _ = compose_haystack(pool, src, f"t{i:04d}", HaystackSpec(sessions=own + size, seed=spec.seed + i))
        turns.append(t.filter(pl.col("session_id").str.starts_with("x")))
    return turns, questions
