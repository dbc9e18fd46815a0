"""The memory view of a tenant: what ``auto``'s memory signals read, written by the build beside the
part's node and turn views so that a cold tenant maps it instead of reading Lance and graph-tool
(docs/decisions/0036-memory-view.md).

``versions/vN/view_memory/<part>.arrow`` holds one record batch of one row per tenant (list columns,
zero-copy once mapped):

* ``mem_row``: the node rows (positions in the tenant's node view) of :data:`MEMORY_KINDS`, ascending;
  ``vector``: their unit vectors (``embedding_matrix`` of their embeddings), flattened;
* ``cite_turn`` / ``cite_mem``: each (citing memory, turn position in the turn view) pair of their
  provenance, sorted by turn then memory (``MemoryFrame``'s cite arrays);
* ``g_*``: the tenant graph's arrays as :func:`memlib.graph.build.load` gives them (vertex and edge
  order of the stored ``.gt``) and its symmetrized adjacency (``a_*``); empty without a graph.

Its batch metadata names the kinds, the sizes, the graph's vocabularies and CRC-32s of the node ids at
``mem_row`` and of the turn ids in order: a reader checks them against the tenant's node and turn views,
so a memory view never answers for views it was not made from. The file itself is trusted only with
the checksum the manifest records for it (memlib/io/checksums.py); anything off raises
:class:`~memlib.io.views.ViewError` and the caller reads Lance and the graph as before.
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from memlib.io.views import VIEW_MEMORY

MEMORY_KINDS = ("event", "fact")  # what auto's default signals read (fact votes, PPR seeds), sorted
_I32, _I64 = pa.list_(pa.int32()), pa.list_(pa.int64())
MEMORY_FIELDS = [
    ("mem_row", _I32), ("vector", pa.list_(pa.float32())), ("cite_turn", _I32), ("cite_mem", _I32),
    ("g_ids", pa.list_(pa.string())), ("g_kind", pa.list_(pa.int16())), ("g_time", pa.list_(pa.float64())),
    ("g_importance", pa.list_(pa.float64())), ("g_src", _I64), ("g_dst", _I64),
    ("g_edge_kind", pa.list_(pa.int16())), ("g_weight", pa.list_(pa.float64())), ("g_relation", _I32),
    ("a_indptr", _I64), ("a_nbr", _I64), ("a_eid", _I64), ("a_fwd", pa.list_(pa.int8())),
    ("t_prob", pa.list_(pa.float64())), ("t_data", pa.list_(pa.float64())), ("t_indices", _I64), ("t_indptr", _I64),
    ("t_sink", pa.list_(pa.int8())),
]
MEMORY_COLUMNS = [name for name, _ in MEMORY_FIELDS]
MEMORY_SCHEMA = pa.schema([pa.field(n, t) for n, t in MEMORY_FIELDS])


def embedding_matrix(col: pa.ChunkedArray | pa.Array, dim: int) -> np.ndarray:
    """FixedSizeList column -> (n, dim) float32, rows L2-normalized, null rows zero."""
    n = len(col)
    if n == 0:
        return np.zeros((0, dim), dtype=np.float32)
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    mat = np.zeros((n, dim), dtype=np.float32)
    if valid.any():
        dense = arr.filter(pa.array(valid))
        mat[valid] = dense.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
    norms = np.linalg.norm(mat, axis=1, keepdims=True)
    return mat / np.maximum(norms, 1e-12)


def ids_crc(ids: list[str]) -> int:
    """CRC-32 of a list of ids (what ties a memory view to the node and turn views it was made from)."""
    return zlib.crc32("\n".join(ids).encode("utf-8"))


def memory_table(node_ids: list[str], kinds: list[str], provenance: list[Any], vectors: np.ndarray,
                 turn_ids: list[str], graph: Any) -> tuple[pa.Table, dict[str, Any]]:
    """One tenant's memory view row and its metadata. ``node_ids``/``kinds``/``provenance``: the
    node view's columns in its order; ``vectors``: the unit vectors of its rows of
    :data:`MEMORY_KINDS` in that order; ``turn_ids``: the turn view's node ids in its order;
    ``graph``: the tenant graph's columns and vocabularies (memlib/graph/memory_arrays.py
    ``graph_columns``; None: no graph)."""
    rows = np.flatnonzero(np.isin(np.asarray(kinds, dtype=object), MEMORY_KINDS)).astype(np.int32)
    if vectors.shape[0] != rows.size:
        raise ValueError(f"memory view: {vectors.shape[0]} vectors for {rows.size} nodes of kinds {MEMORY_KINDS}")
    pos = {t: i for i, t in enumerate(turn_ids)}
    owner, turn = [], []
    for j, r in enumerate(rows.tolist()):
        for t in provenance[r] or ():
            p = pos.get(t)
            if p is not None:
                owner.append(j)
                turn.append(p)
    owner_a, turn_a = np.asarray(owner, dtype=np.int32), np.asarray(turn, dtype=np.int32)
    order = np.lexsort((owner_a, turn_a))
    cols: dict[str, np.ndarray] = {"mem_row": rows, "vector": np.ascontiguousarray(vectors, np.float32).ravel(),
                                   "cite_turn": turn_a[order], "cite_mem": owner_a[order]}
    meta: dict[str, Any] = {"kinds": list(MEMORY_KINDS), "nodes": len(node_ids), "mem": int(rows.size),
                            "dim": int(vectors.shape[1]) if vectors.ndim == 2 else 0, "turns": len(turn_ids),
                            "mem_ids_crc": ids_crc([node_ids[r] for r in rows.tolist()]),
                            "turn_ids_crc": ids_crc(list(turn_ids)), "graph": graph is not None}
    if graph is not None:
        cols.update({k: v for k, v in graph.items() if k in MEMORY_COLUMNS})
        meta.update({k: graph[k] for k in ("node_kinds", "edge_kinds", "relations", "transition_key")})
    arrays = []
    for name, typ in MEMORY_FIELDS:
        values = cols.get(name)
        values = [] if values is None else (list(values) if name == "g_ids" else values)
        arrays.append(pa.array([values], typ) if name == "g_ids" else
                      pa.ListArray.from_arrays(pa.array([0, len(values)], pa.int32()),
                                               pa.array(values, typ.value_type)))
    return pa.Table.from_arrays(arrays, schema=MEMORY_SCHEMA), meta


def json_key(key: tuple) -> str:
    return json.dumps(key, sort_keys=True)


@dataclass
class MemoryView:
    """A tenant's mapped memory view (numpy views of the mapped file's pages)."""

    kinds: tuple[str, ...]
    mem_row: np.ndarray
    vectors: np.ndarray  # (mem, dim) float32
    cite_turn: np.ndarray
    cite_mem: np.ndarray
    graph: dict[str, Any] | None  # the MemoryGraph fields and the adjacency arrays, or None


def _flat(batch: pa.RecordBatch, name: str) -> np.ndarray:
    return batch.column(name).flatten().to_numpy(zero_copy_only=True)


def read_memory_view(reader, tenant: str, node_ids: list[str], turn_ids: list[str]) -> MemoryView:
    """``tenant``'s memory view, checked: its file against the manifest's checksum, its batch against
    ``node_ids`` (the node view's ids) and ``turn_ids`` (the turn view's, in order), its arrays'
    sizes against each other. :class:`~memlib.io.views.ViewError` when any of it is off, the version
    has no memory view of the tenant or records no checksum for it."""
    from memlib.io.checksums import DamagedFileError, check
    from memlib.io.reader_checks import FILES_KEY
    from memlib.io.views import VIEWS, ViewError, view_path

    entry = reader.manifest.get("tenants", {}).get(tenant) or {}
    part = entry.get("part")
    if part is None:
        raise ViewError(f"tenant {tenant!r} has no part in version {reader.version}")
    path = view_path(reader.version_dir, VIEW_MEMORY, part)
    expected = (reader.manifest.get(FILES_KEY) or {}).get(path.relative_to(reader.version_dir).as_posix())
    if expected is None:
        raise ViewError(f"{path}: no checksum in the manifest of version {reader.version}")
    try:
        check(path, expected)
    except (DamagedFileError, OSError) as exc:
        raise ViewError(str(exc)) from None
    batch, meta = VIEWS.tenant(path, tenant, 1), VIEWS.meta(path, tenant)
    try:
        rows, vec = _flat(batch, "mem_row"), _flat(batch, "vector")
        n, dim = int(meta["mem"]), int(meta["dim"])
        ok = (meta["nodes"] == len(node_ids) and meta["turns"] == len(turn_ids) and rows.size == n
              and vec.size == n * dim and (n == 0 or int(rows.max()) < len(node_ids))
              and meta["mem_ids_crc"] == ids_crc([node_ids[r] for r in rows.tolist()])
              and meta["turn_ids_crc"] == ids_crc(turn_ids))
        cite_turn, cite_mem = _flat(batch, "cite_turn"), _flat(batch, "cite_mem")
        ok = ok and cite_turn.size == cite_mem.size and (cite_turn.size == 0 or (
            int(cite_turn.max()) < len(turn_ids) and int(cite_mem.max()) < n and int(cite_turn.min()) >= 0))
        graph = _graph_arrays(batch, meta) if meta.get("graph") else None
    except (KeyError, TypeError, ValueError, pa.ArrowException) as exc:
        raise ViewError(f"{path}: memory view of {tenant!r} unreadable ({str(exc)[:160]})") from None
    if not ok:
        raise ViewError(f"{path}: memory view of {tenant!r} does not match its node and turn views")
    return MemoryView(tuple(meta["kinds"]), rows, vec.reshape(n, dim) if dim else np.zeros((n, 0), np.float32),
                      cite_turn, cite_mem, graph)


def _graph_arrays(batch: pa.RecordBatch, meta: dict[str, Any]) -> dict[str, Any]:
    """The graph's fields (``ValueError`` when their sizes disagree)."""
    g = {name[2:]: _flat(batch, name) for name in MEMORY_COLUMNS if name.startswith("g_") and name != "g_ids"}
    g["ids"] = np.asarray(batch.column("g_ids").flatten().to_pylist(), dtype=object)
    adj = {name[2:]: _flat(batch, name) for name in MEMORY_COLUMNS if name.startswith("a_")}
    nv, ne = g["ids"].size, g["src"].size
    sizes = (g["kind"].size == g["time"].size == g["importance"].size == nv
             and g["dst"].size == g["edge_kind"].size == g["weight"].size == g["relation"].size == ne
             and adj["indptr"].size == nv + 1 and adj["nbr"].size == adj["eid"].size == adj["fwd"].size == 2 * ne)
    inside = sizes and (ne == 0 or int(max(g["src"].max(), g["dst"].max())) < nv and int(adj["nbr"].max()) < nv
                        and int(adj["eid"].max()) < ne and int(adj["indptr"][-1]) == 2 * ne)
    if not inside:
        raise ValueError("graph arrays of disagreeing sizes")
    t = {name[2:]: _flat(batch, name) for name in MEMORY_COLUMNS if name.startswith("t_")}
    if not (t["prob"].size == t["data"].size == t["indices"].size == 2 * ne and t["indptr"].size == nv + 1
            and t["sink"].size == nv and (ne == 0 or int(t["indices"].max()) < nv) and int(t["indptr"][-1]) == 2 * ne):
        raise ValueError("transition arrays of disagreeing sizes")
    g.update(node_kinds=tuple(meta["node_kinds"]), edge_kinds=tuple(meta["edge_kinds"]),
             relations=tuple(meta["relations"]), adjacency=(adj["indptr"], adj["nbr"], adj["eid"],
                                                            adj["fwd"].view(np.bool_)),
             transition=(meta["transition_key"], t["prob"], t["data"], t["indices"], t["indptr"],
                         t["sink"].view(np.bool_)))
    return g
