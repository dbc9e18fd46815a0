"""Graph-area fixtures: small hand-made tenant tables and an independent dense PPR solver."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest


def make_tables(node_kinds: dict[str, str], edges: list[tuple[str, str, str, float]], tenant: str = "t"):
    """(nodes, edges) Arrow tables from {node_id: kind} and (src, dst, kind, weight) tuples."""
    ids = list(node_kinds)
    nodes = pa.table({
        "node_id": ids, "tenant_id": [tenant] * len(ids), "kind": [node_kinds[i] for i in ids],
        "time": pa.array([1_700_000_000_000_000 + i for i in range(len(ids))], pa.int64()).cast(
            pa.timestamp("us", tz="UTC")),
        "importance": pa.array([None] * len(ids), pa.float32()),
    })
    e = pa.table({
        "tenant_id": [tenant] * len(edges), "src": [x[0] for x in edges], "dst": [x[1] for x in edges],
        "kind": [x[2] for x in edges], "weight": pa.array([x[3] for x in edges], pa.float32()),
        "relation": pa.array(["likes" if x[2] == "RELATION" else None for x in edges], pa.string()),
    })
    return nodes, e


def dense_ppr(n: int, traversals: list[tuple[int, int, float]], teleport: np.ndarray, damping: float) -> np.ndarray:
    """Solve (I - d·P'ᵀ) x = (1-d)·v with a dense P built from (u, v, w) traversals;
    sink rows (no positive out-weight) of P' are replaced by v."""
    W = np.zeros((n, n))
    for u, v, w in traversals:
        W[u, v] += w
    v = teleport / teleport.sum()
    P = np.zeros((n, n))
    for u in range(n):
        s = W[u].sum()
        P[u] = W[u] / s if s > 0 else v
    return np.linalg.solve(np.eye(n) - damping * P.T, (1 - damping) * v)


@pytest.fixture
def small_tables():
    """A tenant with a NEXT chain, facts, a concept hub (degree 8), a reflection and an
    isolated (dangling) clue."""
    kinds = {f"turn:{i}": "turn" for i in range(6)}
    kinds.update({"fact:0": "fact", "fact:1": "fact", "concept:hub": "concept", "concept:x": "concept",
                  "reflection:0": "reflection", "clue:lonely": "clue", "entity:a": "entity", "entity:b": "entity"})
    edges = [(f"turn:{i}", f"turn:{i + 1}", "NEXT", 1.0) for i in range(5)]
    edges += [("fact:0", "turn:1", "DERIVED_FROM", 1.0), ("fact:1", "turn:4", "DERIVED_FROM", 1.0),
              ("fact:0", "concept:x", "ABOUT_CONCEPT", 1.0), ("reflection:0", "fact:0", "DERIVED_FROM_FACT", 1.0),
              ("reflection:0", "fact:1", "DERIVED_FROM_FACT", 1.0), ("turn:2", "entity:a", "MENTIONS", 0.7),
              ("entity:a", "entity:b", "RELATION", 0.9), ("turn:3", "turn:3", "SIMILAR", 0.5)]
    edges += [(f"turn:{i}", "concept:hub", "HAS_CONCEPT", 1.0) for i in range(6)]
    edges += [("fact:0", "concept:hub", "ABOUT_CONCEPT", 1.0), ("fact:1", "concept:hub", "ABOUT_CONCEPT", 1.0)]
    return make_tables(kinds, edges)
