"""AssoMem's clue merge: same-tenant clues whose cosine is above delta are one clue (connected
components of the thresholded similarity graph), with the HAS_CLUE edges rewritten to it.

Only the clues of a merged group become Python rows; a clue alone in its group (most of a
tenant's) is copied in columns, and the edges are rewritten in columns, so the merge costs its
merged groups plus a few passes over the tenant's clue columns (the pairs are numpy products,
:func:`memlib.text.similar.pairs_above`). The output is the row-by-row merge's: a merged group in
place of its first member, in row order; a merged id hashes its sorted member ids, so reruns agree.
"""
from __future__ import annotations

import json

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from memlib import ids, schema
from memlib.schema import EdgeKind, NodeKind
from memlib.text.similar import normalize_rows, pairs_above


def clue_text(speakers: list[str], phrases: list[str]) -> str:
    who = " & ".join(speakers)
    body = ", ".join(phrases)
    return f"{who}: {body}" if who else body


def _components(tenants: np.ndarray, v: np.ndarray, threshold: float) -> np.ndarray:
    """Component label per row: union of same-tenant pairs with cosine > threshold."""
    n = len(v)
    ii, jj = [np.zeros(0, int)], [np.zeros(0, int)]
    for tenant in dict.fromkeys(tenants.tolist()):
        members = np.flatnonzero(tenants == tenant)
        i, j, _ = pairs_above(v[members], threshold, None)
        ii.append(members[i])
        jj.append(members[j])
    i, j = np.concatenate(ii), np.concatenate(jj)
    graph = coo_matrix((np.ones(len(i)), (i, j)), shape=(n, n))
    return connected_components(graph, directed=False)[1]


def _merge_group(rows: list[dict], new_id: str) -> dict:
    """One merged clue row from member rows (sorted by time): union of phrases, speakers, provenance."""
    attrs = [json.loads(r["attributes"] or "{}") for r in rows]
    phrases = list(dict.fromkeys(p for a in attrs for p in a.get("keyphrases", [])))
    speakers = list(dict.fromkeys(s for a in attrs for s in a.get("speakers", [])))
    sessions = list(dict.fromkeys(s for a in attrs for s in a.get("session_node_ids", [])))
    convs = {r["conversation_id"] for r in rows}
    times = [r["time"] for r in rows if r["time"] is not None]
    return {
        **rows[0],
        "node_id": new_id,
        "conversation_id": rows[0]["conversation_id"] if len(convs) == 1 else None,
        "session_id": None,
        "text": clue_text(speakers, phrases),
        "time": min(times) if times else None,
        "valid_from": min(times) if times else None,
        "provenance": list(dict.fromkeys(t for r in rows for t in (r["provenance"] or []))),
        "attributes": json.dumps({"keyphrases": phrases, "speakers": speakers, "session_node_ids": sessions,
                                  "merged_from": [r["node_id"] for r in rows]}),
    }


def _alone(nodes: pa.Table) -> pa.Table:
    """Clues alone in their group as the merge writes them: valid from their time, their
    provenance without repeats (first occurrences in order)."""
    frame = pl.from_arrow(nodes.select(["provenance"]))
    empty = pl.lit([], dtype=pl.List(pl.String))
    unique = pl.col("provenance").list.unique(maintain_order=True).fill_null(empty)
    provenance = frame.select(unique).to_arrow().column(0)
    nodes = nodes.set_column(nodes.schema.get_field_index("valid_from"), "valid_from",
                             nodes.column("time").cast(nodes.schema.field("valid_from").type))
    return nodes.set_column(nodes.schema.get_field_index("provenance"), "provenance",
                            provenance.cast(nodes.schema.field("provenance").type))


def merge_clues(clue_nodes: pa.Table, vectors: np.ndarray, threshold: float,
                edges: pa.Table | None = None) -> tuple[pa.Table, pa.Table, dict[str, str]]:
    """Union-find merge of same-tenant clues with cosine > ``threshold`` (AssoMem delta).

    Returns the merged clue nodes, HAS_CLUE edges pointing at them (``edges`` rewritten when
    given, otherwise rebuilt session->clue from each clue's ``session_node_ids``), and the
    map old clue id -> new clue id. A merged id hashes the sorted member ids, so reruns agree.
    """
    v = normalize_rows(vectors)
    if len(v) != clue_nodes.num_rows:
        raise ValueError(f"{len(v)} vectors for {clue_nodes.num_rows} clue nodes")
    clue_nodes = clue_nodes.combine_chunks()  # a tenant's clues come in one chunk per session
    old_ids = clue_nodes.column("node_id").to_pylist()
    id_map = dict(zip(old_ids, old_ids))
    if clue_nodes.num_rows == 0:
        nodes = schema.conform(clue_nodes, schema.NODES_NO_EMBEDDING, name="merged_clues")
        return nodes, (_rewrite_edges(edges, {}) if edges is not None else _rebuild_edges(nodes)), id_map
    tenants = np.asarray(clue_nodes.column("tenant_id").to_pylist(), dtype=object)
    labels = _components(tenants, v, threshold)
    alone = np.bincount(labels)[labels] == 1
    grouped = np.flatnonzero(~alone)
    groups: dict[int, list[dict]] = {}
    first_row: dict[int, int] = {}  # a group's first member row (rows in row order)
    rows_of = clue_nodes.take(pa.array(grouped, pa.int64())).to_pylist()
    for lab, at_row, row in zip(labels[grouped].tolist(), grouped.tolist(), rows_of):
        groups.setdefault(lab, []).append(row)
        first_row.setdefault(lab, at_row)
    merged, first = [], []
    for lab, rows in groups.items():
        rows.sort(key=lambda r: (r["time"] is None, r["time"], r["node_id"]))
        old = [r["node_id"] for r in rows]
        new_id = ids.make_id(NodeKind.CLUE.value, rows[0]["tenant_id"], *sorted(old))
        id_map.update({o: new_id for o in old})
        merged.append(_merge_group(rows, new_id))
        first.append(first_row[lab])
    parts = [_alone(clue_nodes.filter(pa.array(alone)))]
    if merged:
        parts.append(pa.Table.from_pylist(merged, schema=clue_nodes.schema))
    at = np.concatenate([np.flatnonzero(alone), np.asarray(first, dtype=np.int64)])
    nodes = pa.concat_tables(parts).take(pa.array(np.argsort(at, kind="stable"), pa.int64()))
    nodes = schema.conform(nodes, schema.NODES_NO_EMBEDDING, name="merged_clues")
    out_edges = _rewrite_edges(edges, id_map) if edges is not None else _rebuild_edges(nodes)
    return nodes, out_edges, id_map


def _rewrite_edges(edges: pa.Table, id_map: dict[str, str]) -> pa.Table:
    """``edges`` with every end in ``id_map`` renamed, and only the first edge of each
    (tenant, src, dst, kind), in order."""
    moved = {o: n for o, n in id_map.items() if o != n}
    if moved and edges.num_rows:
        old, new = pa.array(list(moved), pa.string()), pa.array(list(moved.values()), pa.string())
        for name in ("src", "dst"):
            col = edges.column(name)
            at = pc.index_in(col, value_set=old)
            renamed = pc.if_else(pc.is_valid(at), new.take(at.fill_null(0)), col)
            edges = edges.set_column(edges.schema.get_field_index(name), name, renamed)
    keys = pl.from_arrow(edges.select(["tenant_id", "src", "dst", "kind"])).with_row_index("_row")
    first = keys.unique(subset=["tenant_id", "src", "dst", "kind"], keep="first", maintain_order=True)["_row"]
    return schema.conform(edges.take(pa.array(first.to_numpy().astype(np.int64), pa.int64())), schema.EDGES,
                          name="merged_clue_edges")


def _rebuild_edges(nodes: pa.Table) -> pa.Table:
    rows = []
    for n in nodes.to_pylist():
        for sid in json.loads(n["attributes"] or "{}").get("session_node_ids", []):
            rows.append({"tenant_id": n["tenant_id"], "src": sid, "dst": n["node_id"],
                         "kind": EdgeKind.HAS_CLUE.value, "weight": 1.0, "provenance": n["provenance"]})
    return schema.conform(pa.Table.from_pylist(rows, schema=schema.EDGES) if rows else schema.empty(schema.EDGES),
                          schema.EDGES, name="merged_clue_edges")


def merged_vectors(id_map: dict[str, str], old_ids: list[str], vectors: np.ndarray,
                   new_ids: list[str]) -> np.ndarray:
    """Vectors of merged clues: the renormalized mean of their members' vectors, in ``new_ids`` order."""
    v = normalize_rows(vectors)
    pos = {n: i for i, n in enumerate(new_ids)}
    label = np.array([pos[id_map[o]] for o in old_ids])
    sums = np.zeros((len(new_ids), v.shape[1]), dtype=np.float64)
    np.add.at(sums, label, v)
    return normalize_rows(sums)
