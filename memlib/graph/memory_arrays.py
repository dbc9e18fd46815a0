"""What a build writes into a tenant's memory view from its graph and tables (the format and its
reader: memlib/io/memory_view.py; docs/decisions/0036-memory-view.md): the graph's arrays as
:func:`memlib.graph.build.load` gives them, its adjacency and the PPR's transition under the default
graph settings, made once at build time instead of at a cold tenant's first query."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pyarrow as pa

from memlib.config import GraphConfig
from memlib.graph.build import load
from memlib.graph.variants import gaama_transition, transition_key
from memlib.io.memory_view import MEMORY_KINDS, VIEW_MEMORY, embedding_matrix, json_key, memory_table

log = logging.getLogger("memlib.build")


def graph_columns(graph_bytes: bytes | None) -> dict[str, Any] | None:
    """The memory view's graph columns and vocabularies of a tenant's stored graph (None: no graph)."""
    if graph_bytes is None:
        return None
    graph = load(graph_bytes)
    adj = graph.adjacency()
    cfg = GraphConfig()  # what auto's PPR term runs with (memlib/retrieve/memory.py ``ppr_term``)
    tr = gaama_transition(graph, cfg)
    return {"g_ids": graph.ids.tolist(), "g_kind": graph.kind, "g_time": graph.time, "g_importance": graph.importance,
            "g_src": graph.src, "g_dst": graph.dst, "g_edge_kind": graph.edge_kind, "g_weight": graph.weight,
            "g_relation": graph.relation, "a_indptr": adj.indptr, "a_nbr": adj.nbr, "a_eid": adj.eid,
            "a_fwd": adj.fwd.astype(np.int8), "t_prob": tr.prob, "t_data": tr.pt.data,
            "t_indices": tr.pt.indices.astype(np.int64), "t_indptr": tr.pt.indptr.astype(np.int64),
            "t_sink": tr.sink.astype(np.int8), "node_kinds": list(graph.node_kinds),
            "edge_kinds": list(graph.edge_kinds), "relations": list(graph.relations),
            "transition_key": json_key(transition_key(cfg))}


def memory_table_from_nodes(nodes: pa.Table, turns: pa.Table, graph_bytes: bytes | None,
                            dim: int) -> tuple[pa.Table, dict[str, Any]]:
    """A tenant's memory view row and metadata from its built tables: its nodes with their
    embeddings (in its node view's order), its turns in the turn view's order, its graph's bytes."""
    kinds = nodes.column("kind").to_pylist()
    typ = nodes.schema.field("embedding").type
    dim = typ.list_size if getattr(typ, "list_size", 0) > 0 else dim
    rows = np.flatnonzero(np.isin(np.asarray(kinds, dtype=object), MEMORY_KINDS))
    vectors = embedding_matrix(nodes.column("embedding").take(pa.array(rows, pa.int64())), dim)
    return memory_table(nodes.column("node_id").to_pylist(), kinds, nodes.column("provenance").to_pylist(),
                        vectors, turns.column("node_id").to_pylist(), graph_columns(graph_bytes))


def memory_views_from_tables(reader, version_dir: Path, parts: Mapping[str, list[str]]) -> int:
    """Write the memory views of ``parts`` (part -> its live tenants) into ``version_dir``, from its
    node and turn view files there, the embeddings of ``reader``'s pinned Lance rows (their digest
    checked first) and its graphs: a store written before memory views gets them as a build carries
    its parts (:attr:`memlib.io.parts.Carried.unremembered`). A part any of whose tenants cannot be
    made gets none (its tenants read Lance and the graph file). Returns the number of files written."""
    from memlib.io.checksums import DamagedFileError
    from memlib.io.views import VIEW_NODES, VIEW_TURNS, read_batches, view_path, write_view

    written = 0
    for part, members in sorted(parts.items()):
        try:
            nodes_b = read_batches(view_path(version_dir, VIEW_NODES, part))
            turns_b = read_batches(view_path(version_dir, VIEW_TURNS, part))
            if not all(t in nodes_b and t in turns_b for t in members):
                continue
            tables, metas = {}, {}
            for t in members:
                tables[t], metas[t] = _from_tables(reader, t, pa.Table.from_batches([nodes_b[t][0]]), turns_b[t][0])
        except DamagedFileError as exc:  # damaged rows are never copied into a view
            log.warning("part %s: no memory view (%s)", part, exc)
            continue
        except Exception as exc:  # noqa: BLE001 - a view is an optimization: its tenants read Lance and the graph
            log.warning("part %s: no memory view (%s: %s)", part, type(exc).__name__, str(exc)[:160])
            continue
        write_view(view_path(version_dir, VIEW_MEMORY, part), VIEW_MEMORY, tables, metas)
        written += 1
    return written


def _from_tables(reader, tenant: str, view_nodes: pa.Table, view_turns: pa.RecordBatch) -> tuple[pa.Table, dict]:
    reader.check_lance_rows(tenant, "nodes")  # its rows' digest first: damaged rows never reach a view
    lance = reader.nodes(tenant, columns=["node_id", "embedding"], kinds=MEMORY_KINDS)
    where = {n: i for i, n in enumerate(lance.column("node_id").to_pylist())}
    ids = view_nodes.column("node_id").to_pylist()
    kinds = view_nodes.column("kind").to_pylist()
    rows = [i for i, k in enumerate(kinds) if k in MEMORY_KINDS]
    if len(where) != len(rows) or any(ids[r] not in where for r in rows):
        raise ValueError(f"tenant {tenant!r}: Lance holds {len(where)} nodes of kinds {list(MEMORY_KINDS)}, "
                         f"its node view {len(rows)} (version {reader.version})")
    vectors = embedding_matrix(lance.column("embedding").take(pa.array([where[ids[r]] for r in rows], pa.int64())),
                               reader.dim)
    return memory_table(ids, kinds, view_nodes.column("provenance").to_pylist(), vectors,
                        view_turns.column("node_id").to_pylist(), graph_columns(reader.graph_bytes(tenant)))
