"""Synthetic memory graphs with the degree profile of a real memlib tenant, for benchmarks
and tests: turns in NEXT chains grouped into sessions, facts derived from turns, concepts
and entities attached with a heavy-tailed (Zipf-like) degree distribution, reflections over
facts, clues per session; about 5 edges per node.

Mix per node budget n: 50 % turns (sessions of 20), 20 % facts, 5 % concepts, 5 % entities,
3 % reflections, the rest sessions and clues. Per turn: 1 NEXT, 1 IN_SESSION, ~2.5
HAS_CONCEPT, ~2 MENTIONS, 1 SIMILAR; per fact: 1–2 DERIVED_FROM, ~2 ABOUT_CONCEPT; per
reflection: 3 DERIVED_FROM_FACT; per entity: ~3 RELATION; per session: 1 HAS_CLUE.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from memlib.graph.model import MemoryGraph

SESSION_TURNS = 20
ZIPF_EXPONENT = 1.1

KINDS = ("turn", "fact", "concept", "entity", "reflection", "session", "clue")
EDGE_KINDS = ("NEXT", "IN_SESSION", "HAS_CONCEPT", "MENTIONS", "SIMILAR", "DERIVED_FROM",
              "ABOUT_CONCEPT", "DERIVED_FROM_FACT", "RELATION", "HAS_CLUE")


def _counts(n: int) -> dict[str, int]:
    turns = max(2, n // 2)
    sessions = max(1, turns // SESSION_TURNS)
    c = {"turn": turns, "fact": n // 5, "concept": max(1, n // 20), "entity": max(1, n // 20),
         "reflection": n * 3 // 100, "session": sessions}
    c["clue"] = max(1, n - sum(c.values()))
    return c


def _zipf_targets(rng: np.random.Generator, size: int, pool: int) -> np.ndarray:
    p = 1.0 / np.arange(1, pool + 1) ** ZIPF_EXPONENT
    targets = rng.choice(pool, size=size, p=p / p.sum())
    return rng.permutation(pool)[targets]  # hubs scattered over the id range


def _edges(rng: np.random.Generator, c: dict[str, int],
           off: dict[str, int]) -> list[tuple[int, np.ndarray, np.ndarray]]:
    t, f, r, e = c["turn"], c["fact"], c["reflection"], c["entity"]
    turns = np.arange(t)
    session_of = np.minimum(turns // SESSION_TURNS, c["session"] - 1)
    chain = turns[:-1][session_of[:-1] == session_of[1:]]
    hc = rng.integers(0, t, size=int(2.5 * t))
    mn = rng.integers(0, t, size=2 * t)
    fdf = np.repeat(np.arange(f), rng.integers(1, 3, size=f))
    fac = rng.integers(0, f, size=2 * f) if f else np.zeros(0, dtype=np.int64)
    rdf = np.repeat(np.arange(r), 3)
    rel = rng.integers(0, e, size=3 * e)
    return [
        (0, chain, chain + 1),
        (1, turns, off["session"] + session_of),
        (2, hc, off["concept"] + _zipf_targets(rng, hc.size, c["concept"])),
        (3, mn, off["entity"] + _zipf_targets(rng, mn.size, e)),
        (4, turns, rng.integers(0, t, size=t)),
        (5, off["fact"] + fdf, rng.integers(0, t, size=fdf.size)),
        (6, off["fact"] + fac, off["concept"] + _zipf_targets(rng, fac.size, c["concept"])),
        (7, off["reflection"] + rdf, off["fact"] + rng.integers(0, max(f, 1), size=rdf.size)),
        (8, off["entity"] + rel, off["entity"] + _zipf_targets(rng, rel.size, e)),
        (9, off["session"] + np.arange(c["session"]), off["clue"] + np.arange(c["session"]) % c["clue"]),
    ]


def synthetic_memory_graph(n: int, seed: int = 0) -> MemoryGraph:
    """A :class:`MemoryGraph` of about ``n`` nodes (no graph-tool object attached)."""
    rng = np.random.default_rng(seed)
    c = _counts(n)
    off, pos = {}, 0
    for k in KINDS:
        off[k] = pos
        pos += c[k]
    kind = np.concatenate([np.full(c[k], i, dtype=np.int16) for i, k in enumerate(KINDS)])
    ids = np.asarray([f"{KINDS[k]}:{i}" for i, k in enumerate(kind.tolist())], dtype=object)
    parts = _edges(rng, c, off)
    src = np.concatenate([p[1] for p in parts]).astype(np.int64)
    dst = np.concatenate([p[2] for p in parts]).astype(np.int64)
    ekind = np.concatenate([np.full(p[1].size, p[0], dtype=np.int16) for p in parts])
    m = src.size
    time = np.where(kind == 0, 1.7e15 + np.arange(pos) * 6e7, np.nan)
    return MemoryGraph(
        ids=ids, kind=kind, node_kinds=KINDS, time=time, importance=np.zeros(pos),
        src=src, dst=dst, edge_kind=ekind, edge_kinds=EDGE_KINDS, weight=np.ones(m),
        relation=np.full(m, -1, dtype=np.int32), relations=(),
        degree=(np.bincount(src, minlength=pos) + np.bincount(dst, minlength=pos)).astype(np.int64),
    )


def to_tables(graph: MemoryGraph, tenant: str = "t") -> tuple[pa.Table, pa.Table]:
    """(nodes, edges) Arrow tables of ``graph`` with the columns :func:`build_graph` reads."""
    ts = pa.array(np.where(np.isnan(graph.time), 0, graph.time).astype(np.int64), pa.int64(),
                  mask=np.isnan(graph.time)).cast(pa.timestamp("us", tz="UTC"))
    nodes = pa.table({
        "node_id": pa.array(graph.ids.tolist(), pa.string()),
        "tenant_id": pa.array([tenant] * graph.num_nodes, pa.string()),
        "kind": pa.array(graph.kind_names().tolist(), pa.string()),
        "time": ts,
        "importance": pa.array(graph.importance.astype(np.float32)),
    })
    rel = np.asarray(graph.relations + ("",), dtype=object)[graph.relation]
    edges = pa.table({
        "tenant_id": pa.array([tenant] * graph.num_edges, pa.string()),
        "src": pa.array(graph.ids[graph.src].tolist(), pa.string()),
        "dst": pa.array(graph.ids[graph.dst].tolist(), pa.string()),
        "kind": pa.array(graph.edge_kind_names().tolist(), pa.string()),
        "weight": pa.array(graph.weight.astype(np.float32)),
        "relation": pa.array(rel.tolist(), pa.string(), mask=graph.relation < 0),
    })
    return nodes, edges
