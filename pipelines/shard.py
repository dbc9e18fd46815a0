"""Read the input and shard it by tenant: one turns file per tenant in the new store version.

The driver streams tenants from the reader (one in memory at a time) and writes each one's
``turns`` and ``questions`` partitions straight into the version directory; the turns file
is then the input block of that tenant's build task. Quarantined records of every tenant go
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
from memlib.io.merge import merge_tenant
from memlib.io.readers import iter_tenants
from memlib.io.result import ReadResult
from memlib.io.store import StoreWriter

QUARANTINE_PART = "input"


@dataclass(frozen=True)
class TenantShard:
    """One tenant's unit of work: where its turns are and where its outputs go."""
    tenant_id: str
    turns_path: str
    nodes_path: str        # staged nodes with embeddings (Lance gets them after the graph stage)
    edges_path: str
    segments_path: str
    turns: int
    graph_path: str = ""   # the tenant's graph-tool file (built by the tenant stage)
    fallbacks_path: str = ""  # its node_fallbacks table (memlib.compose.reuse)
    token_sums_path: str = ""  # its token_sums table (memlib.compose.span_pool.IdSums)

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ShardResult:
    shards: list[TenantShard]
    questions: int
    quarantine_by_reason: dict[str, int]
    quarantined: int
    seen: dict[str, int] = field(default_factory=dict)  # every tenant read -> its valid turns (incremental builds)


def staged_nodes_path(writer: StoreWriter, tenant: str) -> Path:
    p = writer.version_dir / "_staged_nodes" / writer.table_path("turns", tenant).name
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
            if part.questions.num_rows:
                writer.write_table("questions", tenant, part.questions)
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
    read = lambda name, sch: (pq.read_table(p) if (p := writer.table_path(name, tenant)).exists()  # noqa: E731
                              else schema.empty(sch))
    return ReadResult(turns=read("turns", schema.TURNS), questions=read("questions", schema.QUESTIONS))


def _write_tenant(writer: StoreWriter, tenant: str, result) -> TenantShard | None:
    turns = result.turns.filter(pc.equal(result.turns.column("tenant_id"), tenant))
    if turns.num_rows == 0:
        return None
    turns_path = writer.write_table("turns", tenant, turns)
    return TenantShard(tenant_id=tenant, turns_path=str(turns_path),
                       nodes_path=str(staged_nodes_path(writer, tenant)),
                       edges_path=str(writer.table_path("edges", tenant)),
                       segments_path=str(writer.table_path("segments", tenant)),
                       turns=turns.num_rows, graph_path=str(writer.graph_path(tenant)),
                       fallbacks_path=str(writer.table_path("node_fallbacks", tenant)),
                       token_sums_path=str(writer.table_path("token_sums", tenant)))
