"""The row every operator of the build's dataset passes on, and what an operator declares.

One dataset runs the whole build (:mod:`pipelines.staged_build`). Its rows are of two kinds: a
*block* (whole sessions of one or more tenants, at most ``ray.block_turns`` turns) and a
*tenant* (one tenant's shard, built once its sessions are kept). Every row has the columns of
:data:`ROW`. Each operator is a subclass of :class:`Operator` and declares the kind of row it
works on, the columns it reads and writes, and its resources. It changes only its declared
columns and passes the other kind of row on untouched.
"""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa

from pipelines.context import BuildContext


class RowKind(str, Enum):
    BLOCK = "block"
    TENANT = "tenant"


# every row of the build's dataset has these columns (None where a row has nothing yet)
ROW = ("kind", "item", "turns", "vectors", "summary")
ROW_SCHEMA = pa.schema([("kind", pa.string()), ("item", pa.string()), ("turns", pa.large_binary()),
                        ("vectors", pa.large_binary()), ("summary", pa.string())])
BATCH_FORMAT = "pyarrow"  # operators get and return Arrow tables of ROW_SCHEMA (nulls stay nulls)

TEXT_COLUMN = "_text"
KEY_COLUMN = "session_key"
FAILED_DIR = "failed"


class Operator:
    """What an operator of the build's dataset declares. :func:`pipelines.staged_build.build_dataset`
    assembles the dataset from these declarations, one operator after another
    (:data:`pipelines.operators.OPERATORS`)."""
    kind: ClassVar[RowKind]                   # the rows it works on; it passes the other kind on untouched
    reads: ClassVar[tuple[str, ...]]          # the columns of its rows it reads
    writes: ClassVar[tuple[str, ...]]         # the columns it writes (or an error summary)
    # CPUs per actor (or task). None: the embed operator's share, sized from ray.embed_cpus and the
    # cluster (pipelines.staged_build.resources)
    num_cpus: ClassVar[float | None] = None
    uses_gpus: ClassVar[bool] = False         # asks for ray.embed_gpus
    pool: ClassVar[str | None] = None         # the Resources field with its actor count; None: Ray tasks
    one_in_flight: ClassVar[bool] = False     # always one row in flight per actor (else: when blocks are few)

    @classmethod
    def io(cls) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return cls.reads, cls.writes

    @classmethod
    def udf(cls) -> Any:
        """What Ray Data runs: the class itself (an actor per pool member), or a function (tasks)."""
        return cls

    @classmethod
    def arguments(cls, ctx: BuildContext, res: Any) -> dict[str, Any]:
        """The keyword arguments of its constructor (an actor pool) or of its function (tasks)."""
        return {"ctx": ctx}


def on_ray() -> bool:
    """Whether this process is a Ray worker or driver connected to Ray (False: an operator run in
    the driver by :mod:`pipelines.inline`)."""
    import sys

    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def failure_reason(exc: BaseException) -> str:
    """One line: the exception and the innermost frame of memlib code that raised it."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/memlib/" in f.filename
              or "/pipelines/" in f.filename]
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {str(exc)[:300]}{where}".replace("\n", " ")


def rows(batch: pa.Table) -> list[dict[str, Any]]:
    return batch.select(list(ROW)).to_pylist()


def batch_of(items: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist([{c: r.get(c) for c in ROW} for r in items], schema=ROW_SCHEMA)
