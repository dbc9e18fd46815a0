"""Kept session outputs: what the session-local stages produced, reused by later builds.

Layout under the store (one directory per build key, so a config change never reads
outputs of another configuration)::

    cache/sessions/<build_key>/blocks/<block_id>/<table>.arrow     SESSION_TABLES (Arrow IPC; .parquet
                                                                     in blocks kept before 0038)
    cache/sessions/<build_key>/blocks/<block_id>/turn_vectors.arrow  turn vectors (Arrow IPC file)
    cache/sessions/<build_key>/blocks/<block_id>/token_int8t.arrow   their int8 rows, transposed per
                                                                     session (memlib/compose/kept_tokens.py);
                                                                     the turn vectors then keep only scales
    cache/sessions/<build_key>/index/<block_id>.parquet            session_key, tenant_id, turns

A block holds whole sessions of one or more tenants; every row carries its ``session_key``.
The index file is written after the block's tables, atomically, so a block is either
complete and listed or invisible (a crashed build leaves nothing a later one would read).
It names the size and CRC-32 of each of the block's files (Parquet metadata ``memlib.checksums``),
checked before a file is read: a damaged block raises :class:`DamagedFileError` and is never read
(docs/decisions/0031-kept-file-checksums.md).
Block ids are content hashes of the session keys they hold: a retried block overwrites
itself with the same content.
"""
from __future__ import annotations

import hashlib
import logging
import shutil
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from memlib import schema
from memlib.compose.block_checks import BlockChecks, DamagedFileError  # noqa: F401 - DamagedFileError re-exported
from memlib.compose.block_files import VECTORS
from memlib.compose.block_files import batches as _batches
from memlib.compose.block_files import read_table as _read_table
from memlib.compose.block_files import read_vectors as _read_vectors  # noqa: F401 - also the tests'
from memlib.compose.block_files import table_path as _table_path
from memlib.compose.block_files import vectors_path as _vectors_path
from memlib.compose.block_files import with_int8_rows as _with_int8_rows
from memlib.compose.block_files import write_file as _write
from memlib.compose.kept_tokens import INT8T_FILE
from memlib.compose.kept_tokens import read_int8t as _read_int8t
from memlib.compose.kept_tokens import write_int8t as _write_int8t
from memlib.compose.sessions import SESSION_TABLES, SessionOutput, keyed_schema
from memlib.compose.vectors import TurnVectors

log = logging.getLogger("memlib.compose")
SESSIONS_SUBDIR = Path("cache") / "sessions"
READ_THREADS = 4  # blocks read at once by SessionStore.read
# decoded blocks a SessionStore keeps: small tenants built one after another share blocks (a
# block holds up to ray.block_turns turns of many tenants), which were decoded once per tenant
BLOCK_CACHE = 8
MAPPED_BLOCKS = 1024
# the turn vectors (token vectors included: most of a kept session's bytes) are an uncompressed
# Arrow IPC file, memory-mapped when read; the session build key names that format
# (memlib.compose.keys VECTORS_FORMAT, where the measurement is)
INDEX = pa.schema([
    pa.field("session_key", pa.string(), nullable=False),
    pa.field("tenant_id", pa.string(), nullable=False),
    pa.field("turns", pa.int32(), nullable=False),
])


def block_id(session_keys: Iterable[str]) -> str:
    h = hashlib.sha256()
    for k in sorted(set(session_keys)):
        h.update(k.encode("ascii") + b"\n")
    return h.hexdigest()[:24]


def _empty_index() -> pa.Table:
    return schema.empty(INDEX).append_column("block", pa.array([], pa.string()))


class SessionStore(BlockChecks):
    """The kept session outputs of one store and build key."""

    def __init__(self, store: str | Path, build_key: str, dim: int = schema.DEFAULT_EMBED_DIM,
                 trust_unchanged: bool = False):
        self.root = Path(store) / SESSIONS_SUBDIR / build_key
        self.trust_unchanged = trust_unchanged  # a build's: see memlib.compose.block_checks
        self.dim = dim
        self._index: pa.Table | None = None
        # index file -> (its (inode, mtime, size) when read, its rows, its block's checksums): a refresh
        # reads only new or rewritten files (a nightly's tenant actors refresh while blocks are kept;
        # a store holds hundreds of index files)
        self._read: dict[str, tuple[tuple[int, int, int], pa.Table, dict]] = {}
        self._blocks: OrderedDict[tuple, tuple[dict[str, pa.Table], pa.Table]] = OrderedDict()  # see _decoded
        self._vectors: OrderedDict[tuple, pa.Table] = OrderedDict()  # see _mapped
        self._int8t: OrderedDict[tuple, tuple] = OrderedDict()  # see _mapped_t
        self._lock = threading.Lock()
        self.unreadable: dict[str, str] = {}  # block -> why its index file cannot be read (not listed)

    # ---- writing -------------------------------------------------------------------------------
    def write_block(self, block: str, output: SessionOutput, vectors: pa.Table, index: pa.Table) -> None:
        """Write one block's tables, then its index entry (the commit point)."""
        bdir = self.root / "blocks" / block
        for name in SESSION_TABLES:
            _write(schema.conform(output.table(name), keyed_schema(name), name=name), bdir / f"{name}.arrow")
        vectors = schema.conform(vectors, schema.turn_vectors_schema(self.dim), name=VECTORS)
        _write(_write_int8t(vectors, bdir), _vectors_path(bdir))
        self._commit(block, schema.conform(index, INDEX, name="session_index"))
        self._index = None

    # ---- reading -------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Forget the index read so far: blocks written since then (by other workers) count."""
        self._index = None

    def index(self) -> pa.Table:
        """(session_key, tenant_id, turns, block) of every kept session."""
        if self._index is None:
            idir = self.root / "index"
            read: dict[str, tuple[tuple[int, int, int], pa.Table, dict]] = {}
            # names starting with "." are files being written (_write), never read
            for f in sorted(idir.glob("[!.]*.parquet")) if idir.is_dir() else []:
                known = self._index_file(f)
                if known is not None:
                    read[f.stem] = known
            self._read = read
            self._index = (pa.concat_tables([v[1] for v in read.values()]) if read else _empty_index())
        return self._index

    def _lookup(self) -> tuple[dict[str, str], dict[str, int]]:
        """(session key -> the first block holding it, block -> sessions it holds) of the whole
        index, computed once per index read: a server's cold tenant looks its sessions up here
        instead of filtering and grouping every kept session (9 ms at 10,000 tenants)."""
        idx = self.index()
        cached = self.__dict__.get("_lookup_of")
        if cached is not None and cached[0] is idx:
            return cached[1], cached[2]
        where: dict[str, str] = {}
        size: dict[str, set[str]] = {}
        for k, b in zip(idx.column("session_key").to_pylist(), idx.column("block").to_pylist()):
            where.setdefault(k, b)
            size.setdefault(b, set()).add(k)
        counts = {b: len(ks) for b, ks in size.items()}
        self._lookup_of = (idx, where, counts)
        return where, counts

    def _index_file(self, f: Path) -> tuple[tuple[int, int, int], pa.Table, dict] | None:
        """A block's index rows (with its block id), read again only when the file changed; None
        when it is gone."""
        try:
            st = f.stat()
        except FileNotFoundError:  # its block was dropped (retain) since the listing
            return None
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)  # a rewrite (os.replace) is a new inode
        known = self._read.get(f.stem)
        if known is None or known[0] != sig:
            t = self._read_index(f)
            if t is None:
                return None
            known = (sig, t[0].append_column("block", pa.array([f.stem] * t[0].num_rows, pa.string())), t[1])
        return known

    def _index_of(self, blocks: Iterable[str]) -> pa.Table:
        """The index rows of ``blocks`` alone (a tenant of a build reads the blocks it waited for,
        not the index of every kept session)."""
        tables = []
        for b in sorted(set(blocks)):
            known = self._index_file(self.root / "index" / f"{b}.parquet")
            if known is not None:
                self._read[b] = known
                tables.append(known[1])
        return pa.concat_tables(tables) if tables else _empty_index()

    def known(self, keys: Iterable[str]) -> set[str]:
        """Those of ``keys`` whose outputs are kept."""
        keys = list(keys)
        if not keys:
            return set()
        idx = self.index()
        if idx.num_rows == 0:
            return set()
        hit = idx.filter(pc.is_in(idx.column("session_key"), value_set=pa.array(keys, pa.string())))
        return set(hit.column("session_key").to_pylist())

    def blocks_holding(self, keys: Iterable[str]) -> dict[str, str]:
        """Kept session key -> a block holding it, for those of ``keys`` that are kept (what a
        build's driver passes its tenants, so that they read those blocks' index files alone)."""
        keys = list(keys)
        idx = self.index()
        if not keys or idx.num_rows == 0:
            return {}
        hit = idx.filter(pc.is_in(idx.column("session_key"), value_set=pa.array(keys, pa.string())))
        where: dict[str, str] = {}
        for k, b in zip(hit.column("session_key").to_pylist(), hit.column("block").to_pylist()):
            where.setdefault(k, b)
        return where

    def read(self, keys: Iterable[str], blocks: Iterable[str] | None = None) -> tuple[SessionOutput, TurnVectors]:
        """The kept outputs and turn vectors of sessions ``keys`` (all must be kept), in block
        order; ``blocks``: the blocks that hold them, when the caller knows (only their index files
        are read; a key none of them holds is looked up in the whole index). Blocks are read by a
        few threads (Parquet decoding and file reads release the GIL): 2,500 kept LongMemEval
        sessions in 108 blocks took 3.0-3.5 s one block after another and 1.75-2.3 s this way,
        page cache warm (docs/decisions/0013-kept-vectors-by-reference.md)."""
        keys = list(keys)
        found = self._blocks_of(keys, blocks)
        # blocks in the order of the first session each is read for: a tenant's sessions are packed
        # into blocks in its session order, so the parts come out in that order (no reordering take)
        first = {k: i for i, k in reversed(list(enumerate(keys)))}
        found.sort(key=lambda b: min(first.get(k, len(first)) for k in b[1].to_pylist()))
        if len(found) == 1:
            parts = [self._read_block(found[0])]
        else:
            with ThreadPoolExecutor(min(READ_THREADS, len(found)), thread_name_prefix="memlib-sessions") as pool:
                parts = list(pool.map(self._read_block, found))  # in block order, whatever finishes first
        out = SessionOutput({name: pa.concat_tables([t[name] for t, _ in parts]) for name in SESSION_TABLES})
        return out, TurnVectors.concat([v for _, v in parts], self.dim)

    def _read_block(self, block: tuple[Path, pa.Array, bool]) -> tuple[dict[str, pa.Table], TurnVectors]:
        bdir, wanted, whole = block
        full, vectors = self._decoded(bdir)
        tables = {name: t if whole else t.filter(pc.is_in(t.column("session_key"), value_set=wanted))
                  for name, t in full.items()}
        return tables, self._vectors_in(vectors, wanted, whole)

    def _decoded(self, bdir: Path) -> tuple[dict[str, pa.Table], pa.Table]:
        """A block's session tables and its mapped turn vectors, from the last :data:`BLOCK_CACHE`
        blocks read when they are among them (a rewritten block, a new index file, is read anew)."""
        # read whole and filter: a ``filters=`` read goes through the dataset layer, 6.5x
        # slower on the token vectors' binary column (0.39 against 0.06 s for 4 blocks)
        return self._cached(self._blocks, BLOCK_CACHE, bdir, lambda: (
            {name: _read_table(self._checked(bdir, _table_path(bdir, name).name)) for name in SESSION_TABLES},
            self._mapped(bdir)))

    def _cached(self, cache: OrderedDict, limit: int, bdir: Path, make):
        """``cache``'s entry for block ``bdir`` as its index file is now (a rewritten block is read
        anew), made by ``make()`` on a miss; the ``limit`` most recently used are kept."""
        key = (bdir.name, self._read.get(bdir.name, (None,))[0])
        with self._lock:
            hit = cache.get(key)
            if hit is not None:
                cache.move_to_end(key)
                return hit
        hit = make()
        with self._lock:
            cache[key] = hit
            while len(cache) > limit:
                cache.popitem(last=False)
        return hit

    def read_vectors(self, keys: Iterable[str]) -> TurnVectors:
        """Only the turn vectors of sessions ``keys`` (all must be kept): views of the mapped files
        (the blocks' session tables are not read)."""
        return TurnVectors.concat([self._vectors_in(self._mapped(b), w, whole)
                                   for b, w, whole in self._blocks_of(keys)], self.dim)

    def vector_rows(self, keys: Iterable[str], transposed: bool = False) -> list[tuple]:
        """For each block holding sessions ``keys`` (all must be kept): its mapped turn vectors and
        the positions of those sessions' rows in it (memlib/compose/kept_tokens.py joins them);
        with ``transposed``, also its mapped transposed sessions (None for a block without)."""
        out = []
        for bdir, wanted, whole in self._blocks_of(keys):
            t = self._mapped(bdir)
            rows = (np.arange(t.num_rows) if whole else
                    np.flatnonzero(pc.is_in(t.column("session_key"), value_set=wanted).to_numpy(zero_copy_only=False)))
            out.append((t, rows, self._mapped_t(bdir)) if transposed else (t, rows))
        return out

    def _mapped_t(self, bdir: Path) -> pa.Table | None:
        """A block's mapped transposed sessions (or None), kept like its turn vectors."""
        return self._cached(self._int8t, MAPPED_BLOCKS, bdir,
                            lambda: (self._checked(bdir, INT8T_FILE) and _read_int8t(bdir),))[0]

    def _mapped(self, bdir: Path) -> pa.Table:
        """A block's mapped turn vectors, opened once while among the last :data:`MAPPED_BLOCKS`
        read (a server's cold tenants read a few blocks each; opening one took about 1 ms)."""
        return self._cached(self._vectors, MAPPED_BLOCKS, bdir,
                            lambda: _read_vectors(self._checked(bdir, _vectors_path(bdir).name)))

    def _blocks_of(self, keys: Iterable[str], blocks: Iterable[str] | None = None) -> list[tuple[Path, pa.Array, bool]]:
        """(block directory, the sessions of ``keys`` to read from it, whether those are all the
        block holds) for every block needed, looked up in ``blocks`` when given, else (or when
        they miss one) in the whole index; a KeyError names a session that is not kept."""
        keys = sorted(set(keys))
        if blocks is None:
            where, size = self._lookup()
            missing = [k for k in keys if k not in where]
            if missing:
                raise KeyError(f"{len(missing)} session(s) have no kept outputs, e.g. {missing[0]}")
            chosen = {k: where[k] for k in keys}
        else:
            idx = self._index_of(blocks)
            rows = idx.filter(pc.is_in(idx.column("session_key"), value_set=pa.array(keys, pa.string())))
            if set(rows.column("session_key").to_pylist()) != set(keys):
                self.refresh()
                return self._blocks_of(keys)
            # a session may sit in two blocks (written by two runs): read each from one block only
            chosen = {}
            for k, b in zip(rows.column("session_key").to_pylist(), rows.column("block").to_pylist()):
                chosen.setdefault(k, b)
            held = idx.group_by("block").aggregate([("session_key", "count_distinct")])
            size = dict(zip(held.column("block").to_pylist(), held.column("session_key_count_distinct").to_pylist()))
        by_block: dict[str, list[str]] = {}
        for k, b in chosen.items():
            by_block.setdefault(b, []).append(k)
        return [(self.root / "blocks" / b, pa.array(ks, pa.string()), len(ks) == size[b])
                for b, ks in sorted(by_block.items())]

    @staticmethod
    def _vectors_in(t: pa.Table, wanted: pa.Array, whole: bool = False) -> TurnVectors:
        if whole:  # every session of the block is wanted
            return TurnVectors.from_table(t)
        keep = pc.is_in(t.column("session_key"), value_set=wanted).to_numpy(zero_copy_only=False)
        return TurnVectors.from_table(t, rows=np.flatnonzero(keep))  # views of those rows, no copy

    # ---- upgrading -------------------------------------------------------------------------------
    def upgrade(self) -> dict[str, int]:
        """Give every kept block written by an older version the layout a build writes now: its
        session tables as Arrow IPC files of one record batch (from its checked Parquet ones, or
        its files of one batch per session), and its transposed
        sessions (from its turns' int8 rows, or the kernel's quantization of their float16 vectors
        when it kept none: what the embed pass computes) without per-turn int8 rows. Blocks kept
        before checksums get them; a block that cannot be read, or is damaged, is left as it is
        (readers fall back as before; a build drops a damaged one). Each block's index file is
        rewritten last, so readers map the new files."""
        done = skipped = 0
        for b in sorted(set(self.index().column("block").to_pylist())):
            bdir = self.root / "blocks" / b
            try:
                changed = False
                for name in SESSION_TABLES:
                    path = _table_path(bdir, name)
                    if path.suffix == ".parquet" or _batches(path) > 1:  # one batch per session: before 0062
                        _write(_read_table(self._checked(bdir, path.name)), bdir / f"{name}.arrow")
                        if path.suffix == ".parquet":
                            path.unlink()
                        changed = True
                vectors = _read_vectors(_vectors_path(bdir))
                if _read_int8t(bdir) is None and not vectors.column("token_ids").null_count:
                    _write(_write_int8t(_with_int8_rows(vectors), bdir), _vectors_path(bdir))
                    changed = True
                if changed or not self._read.get(b, (None, None, {}))[2]:
                    # a new signature (cached maps of the block are dropped) naming the new checksums
                    self._commit(b, pq.read_table(self.root / "index" / f"{b}.parquet").replace_schema_metadata(None))
                    done += changed
            except (OSError, pa.ArrowException, ValueError, DamagedFileError) as exc:
                log.warning("kept block %s not upgraded (%s)", b, str(exc)[:160])
                skipped += 1
        self._index = None
        return {"session_blocks_upgraded": done, "session_blocks_not_upgraded": skipped}

    # ---- forgetting ------------------------------------------------------------------------------
    def retain(self, live: set[str], *, rewrite: bool = False) -> dict[str, int]:
        """Drop blocks holding no live session. ``rewrite``: also rewrite blocks holding some
        dead sessions without them (hard deletion: nothing of a forgotten session stays)."""
        idx = self.index()
        removed = rewritten = 0
        for b in sorted(set(idx.column("block").to_pylist())):
            keys = set(idx.filter(pc.equal(idx.column("block"), b)).column("session_key").to_pylist())
            if not keys & live:
                (self.root / "index" / f"{b}.parquet").unlink(missing_ok=True)
                shutil.rmtree(self.root / "blocks" / b, ignore_errors=True)
                removed += 1
            elif rewrite and keys - live:
                self._rewrite(b, keys & live)
                rewritten += 1
        self._index = None
        return {"session_blocks_removed": removed, "session_blocks_rewritten": rewritten}

    def _rewrite(self, block: str, keep: set[str]) -> None:
        bdir = self.root / "blocks" / block
        flt = pc.field("session_key").isin(sorted(keep))
        for name in SESSION_TABLES:  # in the format the block has
            path = _table_path(bdir, name)
            table = _read_table(path)
            _write(table.filter(pc.is_in(table.column("session_key"), value_set=pa.array(sorted(keep), pa.string()))),
                   path)
        vectors = _read_vectors(_vectors_path(bdir))
        vectors = vectors.filter(pc.is_in(vectors.column("session_key"), value_set=pa.array(sorted(keep), pa.string())))
        _write(_write_int8t(_with_int8_rows(vectors), bdir), _vectors_path(bdir))
        self._commit(block, pq.read_table(self.root / "index" / f"{block}.parquet", filters=flt)
                     .replace_schema_metadata(None))


def other_build_keys(store: str | Path, keep: str) -> list[Path]:
    """Session output directories of build keys other than ``keep`` (stale after a config change)."""
    root = Path(store) / SESSIONS_SUBDIR
    return [d for d in sorted(root.iterdir()) if d.is_dir() and d.name != keep] if root.is_dir() else []
