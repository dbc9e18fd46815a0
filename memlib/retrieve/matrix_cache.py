"""Per-tenant token matrices of ``auto``: computed once per tenant view and encoder (single
flight, kept in the view's memo: :meth:`memlib.retrieve.tenant.TenantIndex.memo`); with a
``cache_dir`` also written as ``.npz`` (no pickle) and reused by later processes. The file is
keyed by the content it encodes (turn ids and texts in order, the encoder's tag: exact weights
and windowing, token limit), not by store version, so a tenant carried over unchanged by a
nightly build keeps its matrix; writing a tenant's new matrix removes its older files, and
``memlib build --compact`` clears the directory (hard deletion).
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Sequence

import numpy as np

from memlib import ids
from memlib.io.store import LATE_CACHE_SUBDIR
from memlib.retrieve.late import TokenMatrix, build_token_matrix
from memlib.retrieve.token_encoder import MAX_TOKENS, TokenEncoder

CACHE_FORMAT = 2


def content_key(turn_ids: Sequence[str], texts: Sequence[str], encoder_tag: str) -> str:
    """sha256 (20 hex) of what a token matrix encodes: turn ids and texts in order, the encoder's
    exact weights, the token limit and the file format."""
    h = hashlib.sha256(f"{encoder_tag}|{MAX_TOKENS}|{CACHE_FORMAT}".encode())
    for tid, text in zip(turn_ids, texts):
        h.update(b"\x1e" + ids.escape(tid.encode("utf-8")) + b"\x1f" + ids.escape((text or "").encode("utf-8")))
    return h.hexdigest()[:20]


def _cache_file(tenant: str, key: str, cache_dir: Path) -> Path:
    return cache_dir / f"late-{tenant}-{key}.npz"


def _tenant_files(tenant: str, cache_dir: Path) -> list[Path]:
    """This tenant's matrix files (a tenant whose id extends another's is not matched)."""
    if not cache_dir.is_dir():
        return []
    return [f for f in cache_dir.glob(f"late-{tenant}-*.npz") if f.stem.rsplit("-", 1)[0] == f"late-{tenant}"]


def default_cache_dir(index) -> Path:
    """``<store>/cache/late``: token matrices of the store's tenants, keyed by content."""
    return Path(index.reader.path) / LATE_CACHE_SUBDIR


def tenant_matrix(index, encoder: TokenEncoder, cache_dir: str | Path | None = None,
                  prepack_max_turns: int | None = None) -> TokenMatrix:
    """The token matrix of ``index``'s turns by ``encoder`` (the view's memo, then ``cache_dir``,
    then encode). Single flight per tenant view and encoder: concurrent first queries wait for
    one build instead of each encoding the tenant (which, with clients timing out and retrying,
    piled up encodings of the same tenant in a server's thread pool).

    The whole-tenant int8 product is pre-packed here, unless the tenant has more than
    ``prepack_max_turns`` turns: ``auto`` then scores candidates only (memlib/retrieve/first_stage.py)
    and the packed copy, about 1.7 GB at 2,500 LongMemEval sessions, would never be read; it is
    still built on first use by a whole-tenant MaxSim."""
    def build() -> TokenMatrix:
        matrix = _load_or_build(index, encoder, cache_dir)
        if matrix.int8_ok and (prepack_max_turns is None or matrix.n_turns <= prepack_max_turns):
            matrix.int8  # noqa: B018 - built here, once, rather than by the first concurrent queries
        return matrix

    return index.memo(("token_matrix", encoder.tag), build)


def _load_or_build(index, encoder: TokenEncoder, cache_dir: str | Path | None) -> TokenMatrix:
    turn_ids = list(index.turn_order)
    texts = [index.texts[index.row_of[t]] if t in index.row_of else index.turns[t].text for t in turn_ids]
    path = _cache_file(index.tenant, content_key(turn_ids, texts, encoder.tag), Path(cache_dir)) if cache_dir else None
    matrix = _read(path, turn_ids) if path is not None and path.exists() else None
    if matrix is None:
        matrix = build_token_matrix(encoder, turn_ids, texts)
        if path is not None:
            _store(index.tenant, path, matrix)
    return matrix


def precompute(tenant: str, turns, nodes, encoder: TokenEncoder, cache_dir: str | Path) -> bool:
    """Write ``tenant``'s token matrix at build time, from its ``turns`` and ``nodes`` tables as
    they will be stored (same order and texts as a :class:`TenantIndex` reads), so its first
    ``auto`` query does not encode. False when the file already exists."""
    order = turns.sort_by([("session_index", "ascending"), ("turn_index", "ascending")])
    turn_ids = order.column("node_id").to_pylist()
    node_text = dict(zip(nodes.column("node_id").to_pylist(), nodes.column("text").to_pylist()))
    texts = [node_text.get(t, text) for t, text in zip(turn_ids, order.column("text").to_pylist())]
    path = _cache_file(tenant, content_key(turn_ids, texts, encoder.tag), Path(cache_dir))
    if path.exists():
        return False
    _store(tenant, path, build_token_matrix(encoder, turn_ids, texts))
    return True


def _store(tenant: str, path: Path, matrix: TokenMatrix) -> None:
    """Write the tenant's matrix and remove its older ones (a process that has one loaded keeps
    its copy in memory)."""
    _write(path, matrix)
    for old in _tenant_files(tenant, path.parent):
        if old != path:
            old.unlink(missing_ok=True)


def _write(path: Path, m: TokenMatrix) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".npz")  # replicas may write at once
    with os.fdopen(fd, "wb") as fh:
        np.savez(fh, turn_ids=np.asarray(m.turn_ids, dtype=str), owner=m.owner,
                 vectors=m.vectors, idf=m.idf)
    os.replace(tmp, path)


def _read(path: Path, turn_ids: list[str]) -> TokenMatrix | None:
    """The cached matrix, or None when the file is unreadable or encodes other turns (re-encode)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if z["turn_ids"].tolist() != turn_ids:
                return None
            return TokenMatrix(tuple(turn_ids), z["owner"], z["vectors"].astype(np.float16, copy=False), z["idf"])
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None


def store_matrix(tenant: str, texts: Sequence[str], matrix: TokenMatrix, encoder_tag: str,
                 cache_dir: str | Path) -> Path:
    """Write a tenant's matrix where :func:`tenant_matrix` looks for it (keyed by the turn ids
    and texts it encodes and the encoder's tag); the tenant's older files are removed."""
    path = _cache_file(tenant, content_key(list(matrix.turn_ids), list(texts), encoder_tag), Path(cache_dir))
    _store(tenant, path, matrix)
    return path
