"""Input readers: one entry point per operation over every supported format.

``iter_tenants`` streams one tenant at a time, ``iter_batches`` several (the build shards by
tenant, reading them in batches); ``read_input``
concatenates all tenants (small inputs, tests); ``input_fingerprints`` hashes each tenant's
source records so an incremental rebuild can skip unchanged tenants. Formats:

* ``locomo``      LoCoMo JSON (top-level array of samples), see :mod:`memlib.io.locomo`
* ``longmemeval`` LongMemEval JSON (original or third-party variant), :mod:`memlib.io.longmemeval`
* ``jsonl``       generic one-record-per-line format, ``memlib/io/FORMAT.md``
* ``parquet``     the same columns as a Parquet file
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path

from memlib.config import IOConfig
from memlib.io import generic, locomo, longmemeval, parquet
from memlib.io.errors import InputError
from memlib.io.remote import staged_input
from memlib.io.result import ReadResult

__all__ = ["InputFormat", "ReadResult", "InputError", "iter_tenants", "iter_batches", "read_input",
           "input_fingerprints"]


class InputFormat(str, Enum):
    LOCOMO = "locomo"
    LONGMEMEVAL = "longmemeval"
    JSONL = "jsonl"
    PARQUET = "parquet"


_ITER: dict[InputFormat, Callable[[str | Path, IOConfig], Iterator[ReadResult]]] = {
    InputFormat.LOCOMO: locomo.iter_tenants,
    InputFormat.LONGMEMEVAL: longmemeval.iter_tenants,
    InputFormat.JSONL: generic.iter_tenants,
    InputFormat.PARQUET: parquet.iter_tenants,
}
_FINGERPRINTS: dict[InputFormat, Callable[[str | Path], dict[str, str]]] = {
    InputFormat.LOCOMO: locomo.fingerprints,
    InputFormat.LONGMEMEVAL: longmemeval.fingerprints,
    InputFormat.JSONL: generic.fingerprints,
    InputFormat.PARQUET: parquet.fingerprints,
}


def _format(path: str | Path, fmt: InputFormat | str) -> InputFormat:
    try:
        return InputFormat(getattr(fmt, "value", fmt))
    except ValueError:
        choices = ", ".join(f.value for f in InputFormat)
        raise InputError(path, f"unknown input format {fmt!r} (choose one of {choices})") from None


def iter_tenants(path: str | Path, fmt: InputFormat | str, cfg: IOConfig | None = None) -> Iterator[ReadResult]:
    """Yield one :class:`ReadResult` per tenant, in file order (quarantine rows included).
    ``path`` may be an object storage URI (staged locally while read, see memlib.io.remote).

    Raises :class:`InputError` when the file cannot be read at all.
    """
    cfg = cfg or IOConfig()
    reader = _ITER[_format(path, fmt)]
    with staged_input(path, cfg.staging_dir) as local:
        yield from reader(local, cfg)


# a batch of the build's sharding: tenants read together, up to these many bytes of JSONL records
# or rows of Parquet (about 2,000 five-turn tenants), so a tenant's fixed cost of reading is paid
# per batch; a larger tenant is a batch alone
BATCH_BYTES = 2 << 20
BATCH_ROWS = 10_000


def iter_batches(path: str | Path, fmt: InputFormat | str, cfg: IOConfig | None = None) -> Iterator[ReadResult]:
    """Yield whole tenants, several to a :class:`ReadResult` (JSONL and Parquet: consecutive
    tenants up to :data:`BATCH_BYTES` / :data:`BATCH_ROWS`; LoCoMo and LongMemEval, whose
    tenants are large: one each). Every tenant's tables are those :func:`iter_tenants` gives."""
    cfg = cfg or IOConfig()
    kind = _format(path, fmt)
    with staged_input(path, cfg.staging_dir) as local:
        if kind is InputFormat.JSONL:
            yield from generic.iter_batches(local, cfg, BATCH_BYTES)
        elif kind is InputFormat.PARQUET:
            yield from parquet.iter_batches(local, cfg, BATCH_ROWS)
        else:
            yield from _ITER[kind](local, cfg)


SOURCE_SUFFIXES = {"jsonl": (".jsonl",), "parquet": (".parquet",), "locomo": (".json",), "longmemeval": (".json",)}


def input_sources(path: Path, fmt: str) -> list[Path]:
    """One file, or every file of a directory with the format's suffix (one source per file)."""
    if path.is_dir():
        suffixes = SOURCE_SUFFIXES.get(str(fmt), ("",))
        return sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(suffixes))
    return [path]


def read_input(path: str | Path, fmt: InputFormat | str, cfg: IOConfig | None = None) -> ReadResult:
    """All tenants of ``path`` in one :class:`ReadResult`."""
    return ReadResult.concat(list(iter_tenants(path, fmt, cfg)))


def input_fingerprints(path: str | Path, fmt: InputFormat | str,
                       cfg: IOConfig | None = None) -> dict[str, str]:
    """tenant_id -> sha256 hex of that tenant's source records (streaming, no validation).

    ``cfg`` is accepted for interface symmetry; the hash covers the records only.
    """
    return _FINGERPRINTS[_format(path, fmt)](path)
