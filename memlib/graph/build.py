"""Build one tenant's memory graph from its ``nodes`` and ``edges`` tables; save/load ``.gt``.

The ``.gt`` file is graph-tool's native binary format (no pickle). Vertex properties:
``node_id`` (string), ``kind`` (int16 code), ``time`` (double, µs since epoch, NaN when
unknown), ``importance`` (double). Edge properties: ``kind`` (int16 code), ``weight``
(double), ``relation`` (int32 code, -1 = none). Graph properties hold the code vocabularies
(``node_kinds``, ``edge_kinds``, ``relations``), so the file is self-describing.
"""
from __future__ import annotations

import io
from pathlib import Path

import graph_tool as gt
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memlib.config import GraphConfig
from memlib.graph.model import MemoryGraph


class GraphBuildError(ValueError):
    pass


def _codes(column: pa.ChunkedArray | pa.Array, *, null_code: int | None = None) -> tuple[np.ndarray, tuple[str, ...]]:
    """Dictionary-encode a string column: (int codes, vocabulary)."""
    enc = pc.dictionary_encode(column)
    chunks = enc.chunks if isinstance(enc, pa.ChunkedArray) else [enc]
    vocab: dict[str, int] = {}
    out = []
    for ch in chunks:  # chunk dictionaries differ: remap each onto one vocabulary
        local = ch.dictionary.to_pylist()
        remap = np.array([vocab.setdefault(v, len(vocab)) for v in local] or [0], dtype=np.int64)
        if ch.null_count and null_code is None:
            raise GraphBuildError("null value in a required code column")
        idx = pc.fill_null(ch.indices, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        mask = ch.is_null().to_numpy(zero_copy_only=False)
        out.append(np.where(mask, null_code if null_code is not None else 0, remap[idx]))
    codes = np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
    return codes, tuple(vocab)


def _endpoint_index(node_ids: pa.Array, edges: pa.Table, column: str) -> np.ndarray:
    idx = pc.index_in(edges.column(column), value_set=node_ids)
    if idx.null_count:
        bad = pc.filter(edges, pc.is_null(idx)).slice(0, 3)
        sample = [f"{r['src']} -[{r['kind']}]-> {r['dst']}" for r in bad.select(["src", "kind", "dst"]).to_pylist()]
        raise GraphBuildError(
            f"{idx.null_count} edge(s) have a {column} that is not in the nodes table, e.g. {sample}")
    return idx.to_numpy(zero_copy_only=False).astype(np.int64)


def _time_us(nodes: pa.Table) -> np.ndarray:
    if "time" not in nodes.column_names:
        return np.full(nodes.num_rows, np.nan)
    col = nodes.column("time")
    if pa.types.is_timestamp(col.type):
        col = pc.cast(pc.cast(col, pa.timestamp("us", tz=col.type.tz)), pa.int64())
    return pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64)


def _float_col(table: pa.Table, name: str, default: float) -> np.ndarray:
    if name not in table.column_names:
        return np.full(table.num_rows, default)
    col = pc.fill_null(pc.cast(table.column(name), pa.float64()), default)
    return col.to_numpy(zero_copy_only=False).astype(np.float64)


def build_graph(nodes: pa.Table, edges: pa.Table, cfg: GraphConfig | None = None) -> MemoryGraph:
    """One tenant's graph from its ``nodes`` (columns node_id/kind/time/importance) and
    ``edges`` (schema.EDGES) tables. Raises :class:`GraphBuildError` naming the edge when an
    endpoint is missing, and on duplicate node ids. Edges are kept in stable order of their
    source vertex (graph-tool's on-disk order). ``cfg`` is accepted for symmetry with
    the other stages; the build itself is configuration-free."""
    node_ids = nodes.column("node_id").combine_chunks()
    if pc.count_distinct(node_ids).as_py() != len(node_ids):
        raise GraphBuildError("duplicate node_id values in the nodes table")
    src = _endpoint_index(node_ids, edges, "src")
    # graph-tool writes (and re-reads) edges grouped by source vertex: store them in that
    # order from the start so edge ids are the same before and after save/load
    order = np.argsort(src, kind="stable")
    edges = edges.take(pa.array(order))
    src = src[order]
    dst = _endpoint_index(node_ids, edges, "dst")
    kind, node_kinds = _codes(nodes.column("kind"))
    ekind, edge_kinds = _codes(edges.column("kind"))
    if "relation" in edges.column_names:
        rel, relations = _codes(edges.column("relation"), null_code=-1)
    else:
        rel, relations = np.full(edges.num_rows, -1, dtype=np.int64), ()
    n = len(node_ids)
    graph = MemoryGraph(
        ids=np.asarray(node_ids.to_pylist(), dtype=object), kind=kind.astype(np.int16), node_kinds=node_kinds,
        time=_time_us(nodes), importance=_float_col(nodes, "importance", 0.0),
        src=src, dst=dst, edge_kind=ekind.astype(np.int16), edge_kinds=edge_kinds,
        weight=_float_col(edges, "weight", 1.0), relation=rel.astype(np.int32), relations=relations,
        degree=(np.bincount(src, minlength=n) + np.bincount(dst, minlength=n)).astype(np.int64),
    )
    graph.gt = to_graph_tool(graph)
    return graph


def to_graph_tool(graph: MemoryGraph) -> gt.Graph:
    """A directed ``graph_tool.Graph`` carrying every property of ``graph``."""
    g = gt.Graph(directed=True)
    g.add_vertex(graph.num_nodes)
    if graph.num_edges:
        g.add_edge_list(np.column_stack([graph.src, graph.dst]))
    g.vp["node_id"] = g.new_vp("string", vals=graph.ids.tolist())
    _array_prop(g, "v", "kind", "int16_t", graph.kind)
    _array_prop(g, "v", "time", "double", graph.time)
    _array_prop(g, "v", "importance", "double", graph.importance)
    _array_prop(g, "e", "kind", "int16_t", graph.edge_kind)
    _array_prop(g, "e", "weight", "double", graph.weight)
    _array_prop(g, "e", "relation", "int32_t", graph.relation)
    for name, vocab in (("node_kinds", graph.node_kinds), ("edge_kinds", graph.edge_kinds),
                        ("relations", graph.relations)):
        g.gp[name] = g.new_gp("vector<string>", list(vocab))
    return g


def _array_prop(g: gt.Graph, where: str, name: str, value_type: str, values: np.ndarray) -> None:
    prop = g.new_vp(value_type) if where == "v" else g.new_ep(value_type)
    prop.a = values
    (g.vp if where == "v" else g.ep)[name] = prop


def set_importance(graph: MemoryGraph, importance: np.ndarray) -> None:
    """Write global importance into the arrays and the graph-tool vertex property."""
    graph.importance = np.asarray(importance, dtype=np.float64)
    if graph.gt is not None:
        graph.gt.vp["importance"].a = graph.importance


def save(graph: MemoryGraph, path: str | Path) -> Path:
    """Write ``graph`` as a graph-tool ``.gt`` file (atomically, memlib.io.files.atomic_write)."""
    from memlib.io.files import atomic_write

    data = to_bytes(graph)
    return atomic_write(Path(path), lambda fh: fh.write(data))


def to_bytes(graph: MemoryGraph) -> bytes:
    """``graph`` in graph-tool's ``.gt`` format (what a store's graph parts hold per tenant)."""
    g = graph.gt if graph.gt is not None else to_graph_tool(graph)
    buf = io.BytesIO()
    g.save(buf, fmt="gt")
    return buf.getvalue()


def load(source: str | Path | bytes) -> MemoryGraph:
    """Read a graph written by :func:`save` (a ``.gt`` file) or :func:`to_bytes`."""
    if isinstance(source, bytes):
        g = gt.load_graph(io.BytesIO(source), fmt="gt")
    else:
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"graph file not found: {path}")
        g = gt.load_graph(str(path), fmt="gt")
    edges = g.get_edges([g.edge_index])
    order = np.argsort(edges[:, 2], kind="stable")  # back to edge-index (= build) order
    src = edges[order, 0].astype(np.int64)
    dst = edges[order, 1].astype(np.int64)
    n = g.num_vertices()
    id_prop = g.vp["node_id"]
    return MemoryGraph(
        ids=np.asarray([id_prop[v] for v in g.vertices()], dtype=object),
        kind=g.vp["kind"].a.copy(), node_kinds=tuple(g.gp["node_kinds"]),
        time=g.vp["time"].a.copy(), importance=g.vp["importance"].a.copy(),
        src=src, dst=dst, edge_kind=g.ep["kind"].a.copy(), edge_kinds=tuple(g.gp["edge_kinds"]),
        weight=g.ep["weight"].a.copy(), relation=g.ep["relation"].a.copy(), relations=tuple(g.gp["relations"]),
        degree=(np.bincount(src, minlength=n) + np.bincount(dst, minlength=n)).astype(np.int64),
        gt=g,
    )
