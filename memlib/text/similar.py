"""SIMILAR edges between a tenant's nodes: each node's top-k neighbours above a cosine threshold,
cosines computed per pair so a pair's value depends on its two vectors alone, and the same edges
after turns were added or removed, scoring only the pairs that changed (memlib/compose/reuse.py)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from memlib import schema
from memlib.schema import EdgeKind

BLOCK = 1024


def normalize_rows(vectors: np.ndarray) -> np.ndarray:
    v = np.asarray(vectors, dtype=np.float32)
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


# float32 matrix products round differently with the shape of the operands (OpenBLAS picks its
# kernels and blocking by shape and CPU), so a cosine from ``v @ v.T`` depends on which other
# vectors were in the product. The product only proposes candidates, with this margin below the
# threshold (above any float32 rounding of a 384-term dot product of unit vectors, <= 2.3e-5);
# each candidate's cosine is then computed on its own (:func:`exact_cosines`).
CANDIDATE_MARGIN = 1e-4
_EXACT_CHUNK = 65536


def exact_cosines(v: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """float32 cosine of each pair (``v[i]``, ``v[j]``) of unit rows, computed per pair: float64
    products of float32 values are exact and commute, and each row of products is summed in one
    fixed order, so a pair's value depends on its two vectors only. It is the same in a full
    build and a nightly run whatever the tenant's size, and the same for (i, j) and (j, i)."""
    out = np.empty(i.size, dtype=np.float32)
    for a in range(0, i.size, _EXACT_CHUNK):
        b = min(a + _EXACT_CHUNK, i.size)
        prod = v[i[a:b]].astype(np.float64) * v[j[a:b]].astype(np.float64)
        out[a:b] = prod.sum(axis=1)
    return out


def _row_candidates(v: np.ndarray, rows: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair (row, column) with row in ``rows``, column != row and cosine > ``threshold``."""
    rr, cc, ss = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.float32)]
    for start in range(0, rows.size, BLOCK):
        idx = rows[start:start + BLOCK]
        block = v[idx] @ v.T
        block[np.arange(idx.size), idx] = -np.inf  # no self pairs
        r, c = np.nonzero(block > threshold - CANDIDATE_MARGIN)  # few: most pairs are far below
        r = idx[r]
        s = exact_cosines(v, r, c)
        keep = s > threshold
        rr.append(r[keep])
        cc.append(c[keep])
        ss.append(s[keep])
    return np.concatenate(rr), np.concatenate(cc), np.concatenate(ss)


def _top_k(r: np.ndarray, c: np.ndarray, s: np.ndarray, top_k: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's ``top_k`` pairs (ties: the lower column first); all of them when None."""
    if top_k is None or r.size == 0:
        return r, c, s
    order = np.lexsort((c, -s, r))
    r, c, s = r[order], c[order], s[order]
    first = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
    rank = np.arange(r.size) - np.repeat(first, np.diff(np.r_[first, r.size]))
    keep = rank < top_k
    return r[keep], c[keep], s[keep]


def _unordered(i: np.ndarray, j: np.ndarray, s: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each unordered pair once, as (lower, higher) row, in that order."""
    lo, hi = np.minimum(i, j), np.maximum(i, j)
    _, keep = np.unique(lo.astype(np.int64) * n + hi, return_index=True)
    return lo[keep], hi[keep], s[keep].astype(np.float32)


def pairs_above(v: np.ndarray, threshold: float, top_k: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i, j, cos) with i < j and cos > threshold; each row's top_k pairs if given."""
    r, c, s = _top_k(*_row_candidates(v, np.arange(len(v)), threshold), top_k)
    return _unordered(r, c, s, len(v))


def _pairs_changed(v: np.ndarray, added: np.ndarray, affected: np.ndarray,
                   previous: tuple[np.ndarray, np.ndarray, np.ndarray], threshold: float,
                   top_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What :func:`pairs_above` returns for ``v``, from the pairs it returned for the rows of ``v``
    other than ``added`` plus some rows since removed (``previous``, as rows of ``v``, the pairs
    with a removed row left out). A kept row's top_k is the best top_k of its earlier top_k (the
    best of the earlier pairs incident to it) and its pairs with the added rows, unless a removed
    row may have been in it: those rows (``affected``: every row an earlier pair joined to a
    removed row) and the added rows are scored against every row."""
    scored = np.union1d(added, affected)
    r_new, c_new, s_new = _row_candidates(v, scored, threshold)
    # an added row's pair with an unaffected kept row counts in that row's top_k too (a pair of two
    # scored rows is in both rows' candidates already)
    mirror = np.isin(r_new, added) & ~np.isin(c_new, scored)
    pi, pj, ps = previous
    r, c, s = np.concatenate([pi, pj]), np.concatenate([pj, pi]), np.concatenate([ps, ps])
    earlier = ~np.isin(r, affected)  # an affected row's candidates are all scored again
    r = np.concatenate([r[earlier], r_new, c_new[mirror]])
    c = np.concatenate([c[earlier], c_new, r_new[mirror]])
    s = np.concatenate([s[earlier], s_new, s_new[mirror]])
    r, c, s = _top_k(r, c, s, top_k)
    return _unordered(r, c, s, len(v))


@dataclass(frozen=True)
class EarlierEdges:
    """The SIMILAR edges a tenant's published build has between its turns (``src``, ``dst``,
    ``weight``), and what a run changed since: the rows of the turns it added (``added``) and the
    ids of the turns it removed."""
    edges: pa.Table
    added: np.ndarray
    removed: frozenset[str] = frozenset()


def similar_edges_changed(node_ids: list[str] | pa.Array, tenant_id: str, vectors: np.ndarray, threshold: float,
                          earlier: EarlierEdges, top_k: int = 5) -> pa.Table:
    """:func:`similar_edges` of one tenant's nodes given the edges it returned before some were
    added or removed (``earlier``; every other node's vector unchanged): the same edges, scoring
    only the pairs with an added row and the rows whose top_k a removed node was or may have been in."""
    previous, removed = earlier.edges, earlier.removed
    ids = np.asarray(pa.array(node_ids).to_pylist(), dtype=object)
    row = {n: i for i, n in enumerate(ids.tolist())}
    src = previous.column("src").to_pylist()
    dst = previous.column("dst").to_pylist()
    gone = np.fromiter((a in removed or b in removed for a, b in zip(src, dst)), bool, len(src))
    touched = {b if a in removed else a for a, b, g in zip(src, dst, gone) if g} - removed
    src = [a for a, g in zip(src, gone) if not g]
    dst = [b for b, g in zip(dst, gone) if not g]
    if any(a not in row or b not in row for a, b in zip(src, dst)) or any(t not in row for t in touched):
        raise ValueError("an earlier SIMILAR edge names a node that is not among the nodes")
    prev = (np.fromiter((row[a] for a in src), np.int64, len(src)),
            np.fromiter((row[b] for b in dst), np.int64, len(dst)),
            previous.column("weight").to_numpy().astype(np.float32)[~gone])
    affected = np.fromiter(sorted(row[t] for t in touched), np.int64, len(touched))
    i, j, s = _pairs_changed(normalize_rows(vectors), np.asarray(earlier.added, dtype=np.int64), affected, prev,
                             threshold, top_k)
    return _edges_table(tenant_id, ids[i], ids[j], s)


def _edges_table(tenant: str, a: np.ndarray, b: np.ndarray, s: np.ndarray) -> pa.Table:
    src, dst = np.where(a < b, a, b), np.where(a < b, b, a)
    table = pa.table({"tenant_id": pa.array([tenant] * len(s), pa.string()),
                      "src": pa.array(src.tolist(), pa.string()), "dst": pa.array(dst.tolist(), pa.string()),
                      "kind": pa.array([EdgeKind.SIMILAR.value] * len(s), pa.string()),
                      "weight": pa.array(np.asarray(s, dtype=np.float32), pa.float32())})
    return schema.conform(table, schema.EDGES, name="similar_edges")


def similar_edges(node_ids: list[str] | pa.Array, tenant_ids: list[str] | pa.Array, vectors: np.ndarray,
                  threshold: float, top_k: int = 5) -> pa.Table:
    """SIMILAR edges (weight = cosine) between nodes of the same tenant above ``threshold``.

    Each node contributes its ``top_k`` nearest neighbours; every unordered pair is emitted
    once, with ``src`` the lexicographically smaller id.
    """
    node_ids = np.asarray(pa.array(node_ids).to_pylist(), dtype=object)
    tenants = np.asarray(pa.array(tenant_ids).to_pylist(), dtype=object)
    v = normalize_rows(vectors)
    parts = []
    for tenant in dict.fromkeys(tenants.tolist()):
        members = np.flatnonzero(tenants == tenant)
        i, j, s = pairs_above(v[members], threshold, top_k)
        parts.append(_edges_table(tenant, node_ids[members[i]], node_ids[members[j]], s))
    return pa.concat_tables(parts) if parts else schema.empty(schema.EDGES)
