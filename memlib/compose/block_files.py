"""The files of a kept session block (memlib/compose/session_store.py): where each is and how it is
written and read."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from memlib.compose.vectors import TurnVectors
from memlib.io.files import replace_arrow, replace_parquet

VECTORS = "turn_vectors"

# float16 token vectors do not compress (zstd keeps ~92 % of their size) and decompressing them
# was most of the time a tenant took to read its sessions back: stored as they are (measured on
# 20 blocks of LongMemEval sessions: read 1.39 -> 0.40 s, write 1.91 -> 1.00 s, +8 % on disk)
_RAW = frozenset({"token_vectors"})


def write_file(table: pa.Table, path: Path) -> None:
    """``table`` at ``path``; an Arrow IPC file holds it as one record batch (:func:`read_table`)."""
    if path.suffix == ".arrow":
        replace_arrow(table.combine_chunks(), path)
    else:
        replace_parquet(table, path, {c: "none" if c in _RAW else "zstd" for c in table.column_names})


def vectors_path(bdir: Path) -> Path:
    return bdir / f"{VECTORS}.arrow"


def table_path(bdir: Path, name: str) -> Path:
    """A block's session table ``name``: an uncompressed Arrow IPC file, mapped when read (a nightly
    reads every kept session of a tenant it builds: decoding them from Parquet was 2.5 s of a
    2,500-session tenant's, docs/decisions/0038-kept-blocks-by-mtime.md); Parquet in a block kept
    by an earlier version."""
    arrow = bdir / f"{name}.arrow"
    return arrow if arrow.exists() else bdir / f"{name}.parquet"


def read_table(path: Path) -> pa.Table:
    """A block's session table, each column one chunk. The session pass concatenates a block's
    tables from its sessions' outputs, and blocks kept before decision 0062 hold one record batch
    per session: a 2,500-session tenant's tables came back in 2,500-10,000 chunks, and each
    compute call, take, slice and conversion to polars of its tenant steps went chunk by chunk
    (docs/decisions/0062-kept-tables-one-batch.md). Such a file is combined here (a copy of its
    values); one written now is one batch, mapped without a copy."""
    if path.suffix == ".arrow":
        reader = pa.ipc.open_file(pa.memory_map(str(path)))
        table = reader.read_all()
        return table.combine_chunks() if reader.num_record_batches > 1 else table
    return pq.read_table(path).combine_chunks()


def batches(path: Path) -> int:
    """How many record batches an Arrow IPC file holds (more than one: written before 0062)."""
    return pa.ipc.open_file(pa.memory_map(str(path))).num_record_batches


def with_int8_rows(vectors: pa.Table) -> pa.Table:
    """``vectors`` with each turn's int8 rows and scales (the kernel's quantization of its float16
    vectors, row by row: what the embed pass computes) when it lacks them."""
    if "token_int8" in vectors.column_names and vectors.column("token_int8").null_count == 0:
        return vectors
    return TurnVectors.from_table(vectors).table(vectors.column("session_key").to_pylist(),
                                                 vectors.column("tenant_id").to_pylist(),
                                                 vectors.schema.field("vector").type.list_size)


def read_vectors(path: Path) -> pa.Table:
    """A block's turn vectors, memory-mapped (no copy: the table's buffers are the file's pages)."""
    return pa.ipc.open_file(pa.memory_map(str(path))).read_all()
