"""Per-tenant token matrices of ``auto``: computed once per tenant view and encoder (single
flight, kept in the view's memo: :meth:`memlib.retrieve.tenant.TenantIndex.memo`); with a
``cache_dir`` also kept on disk for later processes, in one of two forms, each keyed by the
content it encodes (turn ids and texts in order, the encoder's tag: exact weights and windowing,
token limit), not by store version, so a tenant carried over unchanged by a nightly build keeps
its matrix:

* a reference, written by the build as the tenant's row of the store's ``matrix_refs`` table
  (schema.MATRIX_REFS, in the tenant's part like its other tables): the kept sessions whose
  token vectors make up the matrix (the session build key and the session keys). The build's
  embed pass kept those vectors already (``cache/sessions/``, memory-mapped Arrow files); a
  reference costs the build nothing, where writing the matrix again cost a 500-session tenant
  3 s to assemble and 3 s to write its 670 MB, on every nightly run that touched it. Stores of
  earlier versions hold references as ``late-TENANT-KEY.sessions.json`` files, still read.
* ``late-TENANT-KEY.npz`` (no pickle), written when a query had to encode the tenant (no
  reference, or sessions no longer kept).

Writing a tenant's new matrix file removes its older files. ``memlib build --compact`` (hard
deletion) removes every ``.npz`` and the reference files of tenants no longer published
(jobs/purge.py).
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from memlib import ids, schema
from memlib.embed.token_encoder import MAX_TOKENS, TokenEncoder
from memlib.io.checksums import DamagedFileError
from memlib.io.files import atomic_write
from memlib.io.store import LATE_CACHE_SUBDIR
from memlib.retrieve.late import TokenMatrix, build_token_matrix

CACHE_FORMAT = 2
log = logging.getLogger("memlib.retrieve")


def content_key(turn_ids: Sequence[str], texts: Sequence[str], encoder_tag: str) -> str:
    """sha256 (20 hex) of what a token matrix encodes: turn ids and texts in order, the encoder's
    exact weights, the token limit and the file format."""
    h = hashlib.sha256(f"{encoder_tag}|{MAX_TOKENS}|{CACHE_FORMAT}".encode())
    for tid, text in zip(turn_ids, texts):
        h.update(b"\x1e" + ids.escape(tid.encode("utf-8")) + b"\x1f" + ids.escape((text or "").encode("utf-8")))
    return h.hexdigest()[:20]


REFERENCE_SUFFIX = ".sessions.json"


def _cache_file(tenant: str, key: str, cache_dir: Path) -> Path:
    return cache_dir / f"late-{tenant}-{key}.npz"


def _reference_file(tenant: str, key: str, cache_dir: Path) -> Path:
    return cache_dir / f"late-{tenant}-{key}{REFERENCE_SUFFIX}"


def file_tenant(path: Path) -> str:
    """The tenant a matrix file or reference belongs to (``late-TENANT-KEY.*``; a tenant id may hold "-")."""
    return path.name.split(".", 1)[0][len("late-"):].rsplit("-", 1)[0]


def _tenant_files(tenant: str, cache_dir: Path) -> list[Path]:
    """This tenant's matrix files and references (a tenant whose id extends another's is not matched)."""
    if not cache_dir.is_dir():
        return []
    return [f for f in cache_dir.glob(f"late-{tenant}-*") if file_tenant(f) == tenant]


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
    key = content_key(turn_ids, texts, encoder.tag)
    path = _cache_file(index.tenant, key, Path(cache_dir)) if cache_dir else None
    matrix = _read(path, turn_ids) if path is not None and path.exists() else None
    reader = getattr(index, "reader", None)
    if matrix is None and reader is not None:
        matrix = _from_reference(reader, index.tenant, key, turn_ids, cache_dir)
    if matrix is None:
        matrix = build_token_matrix(encoder, turn_ids, texts)
        if path is not None:
            _store(index.tenant, path, matrix)
    return matrix


def reference_row(tenant: str, turn_ids: Sequence[str], texts: Sequence[str], encoder_tag: str,
                  session_build_key: str, sessions: Sequence[str]) -> pa.Table:
    """``tenant``'s row of the ``matrix_refs`` table: its matrix (its turns ``turn_ids`` with node
    texts ``texts``, in the order a :class:`TenantIndex` reads them) is the token vectors the build
    kept for ``sessions`` under ``session_build_key``."""
    key = content_key(list(turn_ids), list(texts), encoder_tag)
    return pa.Table.from_pylist([{"tenant_id": tenant, "content_key": key, "session_build_key": session_build_key,
                                  "sessions": list(sessions)}], schema=schema.MATRIX_REFS)


def _from_reference(reader, tenant: str, key: str, turn_ids: list[str],
                    cache_dir: str | Path | None) -> TokenMatrix | None:
    """The matrix the tenant's reference names when it encodes ``key``: its ``matrix_refs`` row,
    or a reference file of an earlier store layout; None when there is none (the caller encodes)."""
    rows = [r for r in _view_reference(reader, tenant) or _references(reader, tenant) if r["content_key"] == key]
    if rows:
        return _from_sessions(rows[0], turn_ids, Path(reader.path))
    legacy = _reference_file(tenant, key, Path(cache_dir)) if cache_dir else None
    if legacy is None or not legacy.exists():
        return None
    try:
        body = json.loads(legacy.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return _from_sessions(body, turn_ids, Path(reader.path)) if isinstance(body, dict) and \
        body.get("format") == CACHE_FORMAT else None


def tenant_references(reader, tenant: str) -> list[dict]:
    """The matrix references of ``tenant`` in ``reader``'s version (its turns view's, else its rows
    of the ``matrix_refs`` table): kept sessions named by session build key and session keys."""
    return _view_reference(reader, tenant) or _references(reader, tenant)


# the matrix_refs part files read in this process, decoded once each (a part holds the references
# of dozens of small tenants; reading a tenant's row group took 3-4 ms of a cold query)
_REFERENCES: OrderedDict[str, tuple[tuple[int, int, int], dict[str, list[dict]]]] = OrderedDict()
REFERENCE_FILES = 256


def _view_reference(reader, tenant: str) -> list[dict]:
    """The reference the tenant's turns view keeps (memlib/io/views.py); none when the version has
    no trusted view of it (then the ``matrix_refs`` table is read)."""
    from memlib.io.views import VIEW_TURNS, ViewError

    try:
        ref = reader.view_meta(VIEW_TURNS, tenant).get("matrix_ref")
    except (ViewError, AttributeError):  # AttributeError: a reader of another kind
        return []
    return [ref] if isinstance(ref, dict) else []


def _references(reader, tenant: str) -> list[dict]:
    """``tenant``'s rows of the ``matrix_refs`` table of ``reader``'s version."""
    path = reader.table_file("matrix_refs", tenant)
    try:
        st = path.stat()
    except OSError:
        return []
    sig = (st.st_ino, st.st_mtime_ns, st.st_size)
    with _SESSION_STORES_LOCK:
        hit = _REFERENCES.get(str(path))
        if hit is not None and hit[0] == sig:
            _REFERENCES.move_to_end(str(path))
            return hit[1].get(tenant, [])
    by_tenant: dict[str, list[dict]] = {}
    try:
        rows = pq.read_table(path).to_pylist()
    except (OSError, pa.ArrowException) as exc:  # damaged: not trusted, the tenant is encoded instead
        log.warning("%s unreadable (%s): token matrices of its tenants are encoded", path, str(exc)[:160])
        return []
    for row in rows:
        by_tenant.setdefault(row["tenant_id"], []).append(row)
    with _SESSION_STORES_LOCK:
        _REFERENCES[str(path)] = (sig, by_tenant)
        while len(_REFERENCES) > REFERENCE_FILES:
            _REFERENCES.popitem(last=False)
    return by_tenant.get(tenant, [])


# one SessionStore per (store, session build key) in this process: its index of kept sessions
# (one small file per block, hundreds in a store) is read once, and again only for blocks written
# since, instead of once per cold tenant (1 s of a cold `auto` query at 10,000 tenants)
_SESSION_STORES: dict[tuple[str, str], Any] = {}
_SESSION_STORES_LOCK = threading.Lock()


def _kept(store: Path, session_build_key: str, read: Any) -> Any:
    """``read(session_store)`` on this process's SessionStore of ``store`` and the key, again after
    reading the index files written since when it names a session not kept (KeyError)."""
    from memlib.compose.session_store import SessionStore

    with _SESSION_STORES_LOCK:
        kept = _SESSION_STORES.get((str(store), session_build_key))
        if kept is None:
            kept = _SESSION_STORES[(str(store), session_build_key)] = SessionStore(store, session_build_key)
    try:
        return read(kept)
    except KeyError:  # sessions kept since the index was read: read the new index files
        kept.refresh()
        try:
            return read(kept)
        except KeyError as exc:
            if kept.unreadable:  # an unreadable index file may be the one that lists them: not trusted
                names = ", ".join(sorted(kept.unreadable)[:3])
                raise DamagedFileError(f"{exc.args[0]}, and kept block index(es) {names} cannot be read") from None
            raise


def damaged_tenants(reader, tenants: list[str] | None = None) -> dict[str, str]:
    """Tenant of ``reader``'s version -> why the kept sessions its matrix reference names are
    damaged. Every kept block of the version's session build key is checked, or with ``tenants``
    the blocks holding the sessions those tenants refer to (each file hashed once per identity in
    this process: the service checks tenant by tenant on a thread, so that a cold query finds its
    blocks checked); a block holding only sessions no tenant refers to any more (kept for a later
    run) is no tenant's."""
    key = reader.manifest.get("session_build_key")
    if not key or not (Path(reader.path) / "cache" / "sessions" / key).is_dir():
        return {}

    if tenants is not None:
        return {t: why for t in tenants if (why := _tenant_damage(reader, key, t))}

    def check(kept) -> tuple[dict[str, str], Any]:
        kept.refresh()
        return kept.verify(), kept.index()

    bad, idx = _kept(Path(reader.path), key, check)
    out: dict[str, str] = {}
    if not bad:
        return out
    rows = [r for r in idx.to_pylist() if r["block"] in bad]
    for tenant in sorted({r["tenant_id"] for r in rows}):
        refs = [r for r in tenant_references(reader, tenant)
                if r.get("session_build_key") == key] if reader.has_tenant(tenant) else []
        named = {k for r in refs for k in r["sessions"]}
        hit = [r["block"] for r in rows if r["tenant_id"] == tenant and r["session_key"] in named]
        if hit:
            out[tenant] = f"kept session block damaged: {bad[hit[0]]}"
    return out


def _tenant_damage(reader, key: str, tenant: str) -> str | None:
    """Why the kept blocks holding the sessions ``tenant``'s matrix reference names are damaged."""
    named = [k for r in tenant_references(reader, tenant) if r.get("session_build_key") == key for k in r["sessions"]]
    if not named:
        return None

    def check(kept) -> tuple[dict[str, str], dict[str, str], list[str], list[str]]:
        where = kept.blocks_holding(named)
        return kept.verify(set(where.values())), where, [k for k in named if k not in where], sorted(kept.unreadable)

    bad, where, gone, unreadable = _kept(Path(reader.path), key, check)
    hit = [b for b in where.values() if b in bad]
    if hit:
        return f"kept session block damaged: {bad[hit[0]]}"
    if gone and unreadable:  # an unreadable index file may be the one that lists them: not trusted
        names = ", ".join(unreadable[:3])
        return f"{len(gone)} kept session(s) not listed, and kept block index(es) {names} cannot be read"
    return None


def _from_sessions(ref: dict, turn_ids: list[str], store: Path) -> TokenMatrix | None:
    """The matrix a reference names, from the kept sessions' vectors: joined run by run
    (memlib/compose/kept_tokens.py), else turn by turn (blocks kept before their int8 rows);
    None when the sessions are no longer kept or hold other turns (the caller encodes)."""
    from memlib.compose import kept_tokens
    from memlib.retrieve.late import matrix_from_kept, matrix_from_tokens

    try:
        joined = _kept(store, ref["session_build_key"],
                       lambda k: kept_tokens.join(k.vector_rows(ref["sessions"], transposed=True), turn_ids))
        if joined is not None:
            return matrix_from_kept(turn_ids, joined)
        tv = _kept(store, ref["session_build_key"], lambda k: k.read_vectors(ref["sessions"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    row = {n: i for i, n in enumerate(tv.node_ids)}
    if tv.token_ids is None or tv.token_vectors is None or len(row) != len(turn_ids) or set(row) != set(turn_ids):
        return None
    order = [row[t] for t in turn_ids]
    quantized = None if tv.token_int8 is None or tv.token_scales is None else \
        ([tv.token_int8[i] for i in order], [tv.token_scales[i] for i in order])
    return matrix_from_tokens(turn_ids, [tv.token_ids[i] for i in order], [tv.token_vectors[i] for i in order],
                              quantized=quantized)


def _store(tenant: str, path: Path, matrix: TokenMatrix) -> None:
    """Write the tenant's matrix and remove its older ones (a process that has one loaded keeps
    its copy in memory)."""
    _write(path, matrix)
    _drop_others(tenant, path)


def _drop_others(tenant: str, path: Path) -> None:
    for old in _tenant_files(tenant, path.parent):
        if old != path:
            old.unlink(missing_ok=True)


def _write(path: Path, m: TokenMatrix) -> None:
    # replicas and actors may write one tenant's matrix at once: each through its own temporary file
    atomic_write(path, lambda fh: np.savez(fh, turn_ids=np.asarray(m.turn_ids, dtype=str), owner=m.owner,
                                           vectors=m.vectors, idf=m.idf))


def _read(path: Path, turn_ids: list[str]) -> TokenMatrix | None:
    """The cached matrix, or None when the file is unreadable or encodes other turns (re-encode)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if z["turn_ids"].tolist() != turn_ids:
                return None
            return TokenMatrix(tuple(turn_ids), z["owner"], z["vectors"].astype(np.float16, copy=False), z["idf"])
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None


