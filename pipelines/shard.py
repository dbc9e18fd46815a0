"""Read the input and shard it by tenant: staged turns files in the new store version.

The driver streams batches of tenants from the reader (a bounded number of records in memory
at a time) and stages each batch's turns and questions under ``<version>/_staged/``, one file
each per batch, so a small tenant costs no file of its own; each tenant's rows there are the
input of its build task, which packs them into its row's part (memlib.io.store). Quarantined records of every tenant go
to one ``quarantine/input.parquet`` partition; a malformed record never fails the build.
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from memlib import schema
from memlib.compose.finalize import kind_counts
from memlib.config import MemlibConfig
from memlib.io.files import PLAIN, replace_parquet
from memlib.io.merge import merge_tenant
from memlib.io.readers import iter_batches
from memlib.io.result import ReadResult
from memlib.io.store import StoreWriter

QUARANTINE_PART = "input"


STAGED = "_staged"  # a version directory's inputs and outputs in flight, removed before it is published


@dataclass(frozen=True)
class TenantShard:
    """One tenant's unit of work: its staged input and the version its row's parts go to. A
    staged file holds a batch of tenants; read the tenant's rows with :func:`staged_rows` or
    :class:`StagedFiles`."""
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
    return kind_counts(quarantine, "reason_code") if quarantine.num_rows else {}


RowFilter = Callable[[pa.Table], pa.Table]
Staged = dict[str, tuple[str, str]]  # tenant -> (its staged turns file, its staged questions file), "" for none


def _forget(result, keep_rows: RowFilter | None):
    """``result`` with the rows ``keep_rows`` drops removed from turns, questions and quarantine."""
    if keep_rows is None:
        return result
    return type(result)(turns=keep_rows(result.turns), questions=keep_rows(result.questions),
                        quarantine=keep_rows(result.quarantine))


@dataclass(frozen=True)
class ShardOptions:
    """How :func:`shard_input` stages an input file; the defaults stage every row of every tenant."""
    keep_rows: RowFilter | None = None            # forgetting: drops deleted tenants/conversations from every table
    rebuild: Callable[[str], bool] | None = None  # False: the tenant is carried over, so nothing of it is staged
    quarantine_part: str = QUARANTINE_PART
    # one dict for all files of a run: where each tenant was staged, so that a tenant found again
    # in a later file is merged with what was staged (memlib.io.merge)
    merged: Staged | None = None


def shard_input(path: str | Path, fmt: str, cfg: MemlibConfig, writer: StoreWriter, **options: Any) -> ShardResult:
    """Stage the input's turns and questions, a batch of tenants to a file, and write the
    quarantine; return the shards. ``options``: those of :class:`ShardOptions` (incremental builds
    pass ``keep_rows`` and ``rebuild``)."""
    opts = ShardOptions(**options)
    keep_rows, rebuild, merged = opts.keep_rows, opts.rebuild, opts.merged
    shards: list[TenantShard] = []
    quarantine: list[pa.Table] = []
    seen: dict[str, int] = {}
    n_questions = 0
    prefix = hashlib.sha256(str(path).encode("utf-8")).hexdigest()[:10]
    for i, result in enumerate(iter_batches(path, fmt, cfg.io)):
        result = _forget(result, keep_rows)
        quarantine.append(schema.conform(result.quarantine, schema.QUARANTINE, name="quarantine"))
        tenants = result.tenant_ids
        counts = kind_counts(result.turns, "tenant_id")
        for tenant in tenants:
            seen[tenant] = seen.get(tenant, 0) + counts.get(tenant, 0)
        if rebuild is not None:
            tenants = [t for t in tenants if rebuild(t)]
        n_questions += result.questions.num_rows
        batch, merge_quarantine = _batch(result, tenants, merged, str(path), cfg)
        quarantine += merge_quarantine
        shards += _stage_batch(writer, f"{prefix}-{i:05d}", batch, merged)
    q_all = pa.concat_tables(quarantine) if quarantine else schema.empty(schema.QUARANTINE)
    writer.write_table("quarantine", opts.quarantine_part, q_all)
    return ShardResult(shards=shards, questions=n_questions, quarantine_by_reason=_reason_counts(q_all),
                       quarantined=q_all.num_rows, seen=seen)


def _of(table: pa.Table, tenants: list[str], keep: bool = True) -> pa.Table:
    mask = pc.is_in(table.column("tenant_id"), value_set=pa.array(tenants, pa.string()))
    if keep and mask.null_count == 0 and pc.all(mask).as_py():
        return table  # every row kept (a batch whose tenants are all rebuilt): no copy of its columns
    return table.filter(mask if keep else pc.invert(mask))


def _batch(result: ReadResult, tenants: list[str], merged: Staged | None, source: str,
           cfg: MemlibConfig) -> tuple[ReadResult, list[pa.Table]]:
    """The rows of ``tenants`` in ``result``; a tenant staged by an earlier file of the run has
    its rows merged with those (and the merge's quarantine rows are returned)."""
    batch = ReadResult(turns=_of(result.turns, tenants), questions=_of(result.questions, tenants))
    again = [t for t in tenants if merged is not None and t in merged]
    if not again:
        return batch, []
    assert merged is not None
    parts = [ReadResult(turns=_of(batch.turns, again, keep=False), questions=_of(batch.questions, again, keep=False))]
    for tenant in again:
        later = ReadResult(turns=_of(batch.turns, [tenant]), questions=_of(batch.questions, [tenant]))
        parts.append(merge_tenant(_written(merged[tenant], tenant), later, source, cfg.io))
    conformed = [ReadResult(turns=schema.conform(p.turns, schema.TURNS, name="turns"),
                            questions=schema.conform(p.questions, schema.QUESTIONS, name="questions"))
                 for p in parts]
    merge_q = [schema.conform(p.quarantine, schema.QUARANTINE, name="quarantine") for p in parts[1:]]
    return ReadResult.concat(conformed), merge_q


def _written(where: tuple[str, str], tenant: str) -> ReadResult:
    """What an earlier file of this run staged for ``tenant`` (its turns file, its questions file)."""
    turns, questions = where
    return ReadResult(turns=staged_rows(turns, tenant) if turns else schema.empty(schema.TURNS),
                      questions=staged_rows(questions, tenant) if questions else schema.empty(schema.QUESTIONS))


def staged_rows(path: str | Path, tenant: str, columns: list[str] | None = None) -> pa.Table:
    """The rows of ``tenant`` in a staged file (which holds a batch of tenants)."""
    table = read_staged(path, None if columns is None else list(dict.fromkeys([*columns, "tenant_id"])))
    table = table.filter(pc.equal(table.column("tenant_id"), tenant))
    return table if columns is None else table.select(columns)


def _stage_batch(writer: StoreWriter, name: str, batch: ReadResult, merged: Staged | None) -> list[TenantShard]:
    """Stage a batch's turns and questions (a file each) and return a shard per tenant with turns.
    A tenant with questions only is staged all the same, in case another file has its turns."""
    turns = _stage(writer, "turns", name, batch.turns, schema.TURNS) if batch.turns.num_rows else ""
    questions = _stage(writer, "questions", name, batch.questions, schema.QUESTIONS) if batch.questions.num_rows else ""
    counts, asked = kind_counts(batch.turns, "tenant_id"), kind_counts(batch.questions, "tenant_id")
    shards = []
    for tenant in dict.fromkeys([*counts, *asked]):
        if merged is not None:
            merged[tenant] = (turns if tenant in counts else "", questions if tenant in asked else "")
        if tenant in counts:
            shards.append(TenantShard(tenant_id=tenant, turns_path=turns, version_dir=str(writer.version_dir),
                                      turns=counts[tenant], questions_path=questions if tenant in asked else ""))
    return shards


def _stage(writer: StoreWriter, kind: str, name: str, table: pa.Table, table_schema: pa.Schema) -> str:
    table = schema.conform(table, table_schema, name=kind)  # read within the run, then removed: plain
    path = str(replace_parquet(table, staged_path(writer.version_dir, kind, name), **PLAIN))
    with _WRITTEN_LOCK:
        _WRITTEN[path] = (_signature(path), table)
        while len(_WRITTEN) > WRITTEN_KEEP:
            _WRITTEN.popitem(last=False)
    return path


# the staged files this process wrote last, with their tables: the driver packs the pending sessions
# from them, and a run in the driver builds its tenants from them, without reading them back (a
# 27k-turn file took 0.13 s to read, twice). A file replaced since (its inode, size or mtime) is read.
_WRITTEN: OrderedDict[str, tuple[tuple, pa.Table]] = OrderedDict()
_WRITTEN_LOCK = threading.Lock()
WRITTEN_KEEP = 3


def _signature(path: str) -> tuple:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def read_staged(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    """A staged file's table (its ``columns``): the one this process wrote there when the file is
    still that one."""
    key = str(path)
    with _WRITTEN_LOCK:
        written = _WRITTEN.get(key)
    try:
        if written is not None and written[0] == _signature(key):
            return written[1] if columns is None else written[1].select(columns)
    except OSError:
        pass
    return pq.read_table(key, columns=columns)


class StagedFiles:
    """A reader of staged files that keeps the last few read whole: the tenants of a tenant row
    mostly share their staged files, so each file is read once per row, not once per tenant."""

    def __init__(self, keep: int = 3):
        self.keep = keep
        self._files: OrderedDict[str, tuple[pa.Table, dict[str, tuple[int, int]]]] = OrderedDict()
        self._lock = threading.Lock()  # a run in the driver builds tenant rows on several threads

    def rows(self, path: str | Path, tenant: str) -> pa.Table:
        """The rows of ``tenant`` in the staged file ``path`` (safe to call from several threads)."""
        key = str(path)
        with self._lock:
            if key not in self._files:
                table = by_tenant(read_staged(key))
                self._files[key] = (table, tenant_runs(table))
                while len(self._files) > self.keep:
                    self._files.popitem(last=False)
            self._files.move_to_end(key)
            table, runs = self._files[key]
        start, length = runs.get(tenant, (0, 0))
        return table.slice(start, length)


def by_tenant(table: pa.Table) -> pa.Table:
    """``table`` sorted by tenant_id, stable (row order kept per tenant); itself, not a copy of its
    columns, when it is in that order already (a staged file of one tenant, of tenants read in order)."""
    if _sorted(table.column("tenant_id")):
        return table
    return table.sort_by([("tenant_id", "ascending")])


def _sorted(col: pa.ChunkedArray) -> bool:
    if len(col) < 2:
        return True
    col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col.null_count == 0 and not pc.any(pc.less(col.slice(1), col.slice(0, len(col) - 1))).as_py()


def tenant_runs(table: pa.Table) -> dict[str, tuple[int, int]]:
    """Tenant -> (offset, length) of its rows in ``table`` (sorted by tenant_id)."""
    col = table.column("tenant_id")
    if len(col) == 0:
        return {}
    col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    change = pc.not_equal(col.slice(1), col.slice(0, len(col) - 1)).to_numpy(zero_copy_only=False)
    starts = np.r_[0, np.flatnonzero(change) + 1]
    ends = np.r_[starts[1:], len(col)]
    values = col.take(pa.array(starts)).to_pylist()
    return {v: (int(a), int(b - a)) for v, a, b in zip(values, starts, ends)}
