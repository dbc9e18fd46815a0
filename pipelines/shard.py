"""Read the input and shard it by tenant: one staged turns file per tenant in the new store version.

The driver streams tenants from the reader (one in memory at a time) and stages each one's
turns and questions under ``<version>/_staged/``; the turns file is then the input of that
tenant's build task, which packs both into its row's part (memlib.io.store). Quarantined records of every tenant go
to one ``quarantine/input.parquet`` partition; a malformed record never fails the build.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from memlib import schema
from memlib.config import MemlibConfig
from memlib.io.files import replace_parquet
from memlib.io.merge import merge_tenant
from memlib.io.readers import iter_tenants
from memlib.io.result import ReadResult
from memlib.io.store import StoreWriter

QUARANTINE_PART = "input"


STAGED = "_staged"  # a version directory's inputs and outputs in flight, removed before it is published


@dataclass(frozen=True)
class TenantShard:
    """One tenant's unit of work: its staged input and the version its row's parts go to."""
    tenant_id: str
    turns_path: str        # its staged turns (the tenant task's input; its part's turns come from them)
    version_dir: str       # where the parts of the row it is built in are written
    turns: int
    questions_path: str = ""  # its staged questions (packed into its part), when it has any

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ShardResult:
    shards: list[TenantShard]
    questions: int
    quarantine_by_reason: dict[str, int]
    quarantined: int
    seen: dict[str, int] = field(default_factory=dict)  # every tenant read -> its valid turns (incremental builds)


def staged_path(version_dir: str | Path, kind: str, name: str) -> Path:
    """``version_dir/_staged/<kind>/<name>.parquet`` (its folder made)."""
    p = Path(version_dir) / STAGED / kind / f"{name}.parquet"
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def _reason_counts(quarantine: pa.Table) -> dict[str, int]:
    from memlib.compose.finalize import kind_counts

    return kind_counts(quarantine, "reason_code") if quarantine.num_rows else {}


RowFilter = Callable[[pa.Table], pa.Table]


def _forget(result, keep_rows: RowFilter | None):
    """``result`` with the rows ``keep_rows`` drops removed from turns, questions and quarantine."""
    if keep_rows is None:
        return result
    return type(result)(turns=keep_rows(result.turns), questions=keep_rows(result.questions),
                        quarantine=keep_rows(result.quarantine))


def shard_input(path: str | Path, fmt: str, cfg: MemlibConfig, writer: StoreWriter, *,
                keep_rows: RowFilter | None = None, rebuild: Callable[[str], bool] | None = None,
                quarantine_part: str = QUARANTINE_PART, merged: set[str] | None = None) -> ShardResult:
    """Write per-tenant turns/questions partitions and the quarantine; return the shards.

    Incremental builds pass ``keep_rows`` (forgetting: drops deleted tenants/conversations from
    every table) and ``rebuild`` (False: the tenant is carried over, so no partition is written).
    ``merged`` (one set for all files of a run) names the tenants already written by an earlier
    file: a tenant found again is merged with what was written (:mod:`memlib.io.merge`)."""
    shards: list[TenantShard] = []
    quarantine: list[pa.Table] = []
    seen: dict[str, int] = {}
    n_questions = 0
    for result in iter_tenants(path, fmt, cfg.io):
        result = _forget(result, keep_rows)
        quarantine.append(schema.conform(result.quarantine, schema.QUARANTINE, name="quarantine"))
        tenants = result.tenant_ids
        for tenant in tenants:
            seen[tenant] = seen.get(tenant, 0) + int(pc.sum(pc.equal(result.turns.column("tenant_id"),
                                                                     tenant)).as_py() or 0)
        if rebuild is not None:
            tenants = [t for t in tenants if rebuild(t)]
        n_questions += result.questions.num_rows
        for tenant in tenants:
            part = _tenant_part(result, tenant)
            if merged is not None and tenant in merged:
                part = merge_tenant(_written(writer, tenant), part, str(path), cfg.io)
                quarantine.append(schema.conform(part.quarantine, schema.QUARANTINE, name="quarantine"))
            shard = _write_tenant(writer, tenant, part)
            if shard is not None:
                shards.append(shard)
            if merged is not None and (shard is not None or part.questions.num_rows):
                merged.add(tenant)
    q_all = pa.concat_tables(quarantine) if quarantine else schema.empty(schema.QUARANTINE)
    writer.write_table("quarantine", quarantine_part, q_all)
    return ShardResult(shards=shards, questions=n_questions, quarantine_by_reason=_reason_counts(q_all),
                       quarantined=q_all.num_rows, seen=seen)


def _tenant_part(result: ReadResult, tenant: str) -> ReadResult:
    of = lambda t: t.filter(pc.equal(t.column("tenant_id"), tenant))  # noqa: E731
    return ReadResult(turns=of(result.turns), questions=of(result.questions),
                      quarantine=schema.empty(schema.QUARANTINE))


def _written(writer: StoreWriter, tenant: str) -> ReadResult:
    """What an earlier file of this run wrote for ``tenant``."""
    read = lambda kind, sch: (pq.read_table(p) if (p := staged_path(writer.version_dir, kind, tenant)).exists()  # noqa: E731
                              else schema.empty(sch))
    return ReadResult(turns=read("turns", schema.TURNS), questions=read("questions", schema.QUESTIONS))


def _stage(writer: StoreWriter, kind: str, tenant: str, table: pa.Table, table_schema: pa.Schema) -> Path:
    table = schema.conform(table, table_schema, name=kind)
    return replace_parquet(table, staged_path(writer.version_dir, kind, tenant))


def _write_tenant(writer: StoreWriter, tenant: str, result) -> TenantShard | None:
    """Stage the tenant's turns and questions; its shard, or None when it has no turn (its
    questions are staged all the same, in case another file of the run has its turns)."""
    turns = result.turns.filter(pc.equal(result.turns.column("tenant_id"), tenant))
    questions = _stage(writer, "questions", tenant, result.questions, schema.QUESTIONS) \
        if result.questions.num_rows else None
    if turns.num_rows == 0:
        return None
    turns_path = _stage(writer, "turns", tenant, turns, schema.TURNS)
    return TenantShard(tenant_id=tenant, turns_path=str(turns_path), version_dir=str(writer.version_dir),
                       turns=turns.num_rows, questions_path=str(questions or ""))
