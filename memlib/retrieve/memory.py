"""``auto``'s reads of the memory graph: derived memories voting for their turns, the question's
time windows, personalized PageRank from the memories the question matches, and the rank fusion
that joins them to the turn ranking (docs/decisions/0032-auto-reads-memory.md)."""
from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import numpy as np
import scipy.sparse as sp

from memlib.config import GraphConfig
from memlib.graph.model import Adjacency, MemoryGraph
from memlib.graph.ppr import Transition
from memlib.graph.variants import gaama_ppr_scores, gaama_transition, transition_key
from memlib.io.memory_view import MemoryView, json_key, read_memory_view
from memlib.io.views import ViewError
from memlib.retrieve.event_time import event_window, mention_votes
from memlib.retrieve.push import push_ppr

log = logging.getLogger("memlib.serve")
VOTE_KINDS = ("fact", "event", "entity", "clue", "reflection", "triplet", "concept")


class MemoryFrame:
    """A tenant's derived nodes of ``kinds`` aligned with its :class:`~memlib.retrieve.signals.TurnFrame`:
    their unit vectors (the build's passage vectors), kinds, and for each turn the nodes
    citing it through provenance (CSC-like: ``cite_ptr``/``cite_row``). Built once per tenant view."""

    def __init__(self, index, frame, kinds: tuple[str, ...]):
        rows = index.rows_of_kind(kinds)
        prov = index.provenance
        owner, turn = [], []
        for j, r in enumerate(rows.tolist()):
            for t in prov[r]:
                p = frame.pos.get(t)
                if p is not None:
                    owner.append(j)
                    turn.append(p)
        owner_a, turn_a = np.asarray(owner, dtype=np.int64), np.asarray(turn, dtype=np.int64)
        order = np.lexsort((owner_a, turn_a))
        self.cite_row = owner_a[order]
        self.cite_ptr = np.zeros(len(frame.ids) + 1, dtype=np.int64)
        np.cumsum(np.bincount(turn_a, minlength=len(frame.ids)), out=self.cite_ptr[1:])
        self.rows = rows
        self.kind = np.asarray(index.kinds[rows], dtype=object) if rows.size else np.zeros(0, dtype=object)
        self.node_ids = [index.node_ids[r] for r in rows.tolist()]
        self.vectors = _vectors(index, rows, kinds)

    @classmethod
    def mapped(cls, index, frame, kinds: tuple[str, ...], view: MemoryView) -> "MemoryFrame":
        """The frame of ``kinds`` (all among the view's kinds) from the tenant's mapped memory view:
        the same arrays as built from the node columns, with no Lance read and no provenance walk
        (docs/decisions/0036-memory-view.md)."""
        self = object.__new__(cls)
        wanted = np.isin(index.kinds[view.mem_row], kinds)
        sel = np.flatnonzero(wanted)
        keep = wanted[view.cite_mem]
        renumber = np.cumsum(wanted, dtype=np.int64) - 1
        self.cite_row = renumber[view.cite_mem[keep]]
        turns = view.cite_turn[keep]
        self.cite_ptr = np.zeros(len(frame.ids) + 1, dtype=np.int64)
        np.cumsum(np.bincount(turns, minlength=len(frame.ids)), out=self.cite_ptr[1:])
        self.rows = view.mem_row[sel].astype(np.int64)
        self.kind = np.asarray(index.kinds[self.rows], dtype=object) if self.rows.size else np.zeros(0, dtype=object)
        ids = index.node_ids
        self.node_ids = [ids[r] for r in self.rows.tolist()]
        self.vectors = view.vectors if sel.size == view.mem_row.size else np.ascontiguousarray(view.vectors[sel])
        if not self.rows.size:
            self.vectors = np.zeros((0, 0), dtype=np.float32)
        return self

    def votes(self, sims: np.ndarray, kind: str) -> np.ndarray:
        """Per turn: the best cosine (clipped at 0) of a node of ``kind`` citing it (0: none does)."""
        val = np.where(self.kind == kind, np.maximum(sims, 0.0), 0.0)[self.cite_row]
        out = np.zeros(self.cite_ptr.size - 1)
        has = np.flatnonzero(np.diff(self.cite_ptr) > 0)
        if has.size and val.size:
            out[has] = np.maximum.reduceat(val, self.cite_ptr[has])
        return out

    def citing(self, positions: np.ndarray | None) -> np.ndarray:
        """The memories (indices into this frame, ascending) citing a turn at ``positions`` of the
        frame (None: every memory). Read from the citations by turn: a query touches only the
        memories of its scored turns (docs/decisions/0039-local-memory-signals.md)."""
        if positions is None:
            return np.arange(len(self.node_ids), dtype=np.int64)
        return np.unique(self.cite_row[_slots(self.cite_ptr, positions)])

    def votes_at(self, positions: np.ndarray | None, rows: np.ndarray, sims: np.ndarray, kind: str) -> np.ndarray:
        """:meth:`votes` of the turns at ``positions`` only (None: every turn), from ``sims``, the
        cosines of the memories ``rows`` (ascending, holding every memory citing those positions):
        the same values."""
        if positions is None:
            return self.votes(sims, kind)
        slots = _slots(self.cite_ptr, positions)
        local = np.searchsorted(rows, self.cite_row[slots])
        val = np.where(self.kind[rows] == kind, np.maximum(sims, 0.0), 0.0)[local]
        counts = self.cite_ptr[positions + 1] - self.cite_ptr[positions]
        out = np.zeros(positions.size)
        has = np.flatnonzero(counts > 0)
        if has.size:
            out[has] = np.maximum.reduceat(val, (np.cumsum(counts) - counts)[has])
        return out

    def any_citing(self, flags: np.ndarray, positions: np.ndarray | None) -> np.ndarray:
        """Per turn at ``positions`` (None: every turn): whether a memory with ``flags`` set cites it."""
        pos = np.arange(self.cite_ptr.size - 1) if positions is None else positions
        counts = self.cite_ptr[pos + 1] - self.cite_ptr[pos]
        owner = np.repeat(np.arange(pos.size), counts)
        out = np.zeros(pos.size, dtype=bool)
        out[owner[flags[self.cite_row[_slots(self.cite_ptr, pos)]]]] = True
        return out


def _slots(ptr: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The entries ``ptr[p]:ptr[p + 1]`` of every position ``p``, concatenated in order."""
    starts, counts = ptr[positions], ptr[positions + 1] - ptr[positions]
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    return np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(total, dtype=np.int64)


def _vectors(index, rows: np.ndarray, kinds: tuple[str, ...]) -> np.ndarray:
    """Unit vectors of the nodes at ``rows`` (all of ``kinds``): sliced from the tenant's matrix when
    another strategy loaded it, else read from Lance for these kinds only (``auto`` does not load
    every node's vector, docs/decisions/0028-tenant-views.md)."""
    if rows.size == 0:
        return np.zeros((0, 0), dtype=np.float32)
    if "embeddings" in index.__dict__:
        return np.ascontiguousarray(index.embeddings[rows])
    from memlib.io.memory_view import embedding_matrix

    # the tenant's Lance rows are checked against their digest first (once per process): a damaged
    # row is never read (DamagedFileError, part "lance": the service answers 503 for this strategy)
    index.reader.check_lance_rows(index.tenant, "nodes")
    tbl = index.reader.nodes(index.tenant, columns=["node_id", "embedding"], kinds=kinds)
    if tbl.num_rows != rows.size:
        raise RuntimeError(f"tenant {index.tenant!r}: Lance holds {tbl.num_rows} nodes of kinds {list(kinds)}, "
                           f"its view {rows.size} (version {index.version})")
    matrix = embedding_matrix(tbl.column("embedding"), index.reader.dim)
    where = {int(r): i for i, r in enumerate(rows.tolist())}
    order = np.asarray([where[index.row_of[n]] for n in tbl.column("node_id").to_pylist()], dtype=np.int64)
    out = np.empty_like(matrix)
    out[order] = matrix
    return out


def memory_view(index) -> MemoryView | None:
    """The tenant's mapped memory view (memlib/io/memory_view.py), None when its version has none to
    trust (a store written before them, a file that fails its checksum or disagrees with the tenant's
    node and turn views): then the memory signals read Lance and the graph file (memoized)."""
    def load() -> MemoryView | None:
        try:
            return read_memory_view(index.reader, index.tenant, index.node_ids, index.turn_order)
        except ViewError as exc:
            log.debug("tenant %s: memory signals read Lance and the graph (%s)", index.tenant, exc)
            return None
    return index.memo(("memory_view",), load)


def memory_frame(index, frame, kinds: tuple[str, ...]) -> MemoryFrame:
    """The tenant's :class:`MemoryFrame` of ``kinds`` (memoized on the tenant view): mapped from its
    memory view when that holds those kinds, else built from the node columns and Lance."""
    def build() -> MemoryFrame:
        view = memory_view(index) if frame.ids == index.turn_order else None
        if view is not None and set(kinds) <= set(view.kinds):
            return MemoryFrame.mapped(index, frame, kinds, view)
        return MemoryFrame(index, frame, kinds)
    return index.memo(("auto_memory", kinds), build)


def tenant_graph(index) -> MemoryGraph | None:
    """The tenant graph the PPR runs on: made from the memory view's arrays (no graph-tool load, the
    adjacency as stored), else the graph file's (``index.graph``); None without a graph."""
    view = memory_view(index)
    if view is None:
        return index.graph if index.has_graph else None
    if view.graph is None:
        return None

    def make() -> MemoryGraph:
        g = dict(view.graph)
        indptr, nbr, eid, fwd = g.pop("adjacency")
        key, prob, data, indices, t_indptr, sink = g.pop("transition")
        n = g["ids"].size
        degree = (np.bincount(g["src"], minlength=n) + np.bincount(g["dst"], minlength=n)).astype(np.int64)
        adj = Adjacency(indptr=indptr, nbr=nbr, eid=eid, fwd=fwd)
        graph = MemoryGraph(**g, degree=degree, _adj=adj)
        default = transition_key(GraphConfig())
        if key == json_key(default):  # the PPR's transition as the build made it (the same floats)
            pt = sp.csr_matrix((data, indices, t_indptr), shape=(n, n))
            graph._cache[default] = Transition(pt=pt, sink=sink, rows=adj.rows(), cols=nbr, prob=prob)
        return graph
    return index.memo(("memory_graph",), make)


def query_vector(index, q_vecs: np.ndarray, query: str) -> np.ndarray | None:
    """The question's vector in the space of the tenant's node vectors. A store embedded by
    ``minilm-tokens`` (the default) pools a text's token vectors into its vector
    (memlib/embed/tokens_backend.py), so the question's is the normalized mean of the token
    vectors ``auto`` already has: no second encoding. Another embedder's store (or node vectors of
    another size than the token vectors): the tenant's query embedder (None when it has none)."""
    from memlib.embed.space import built_space

    space = built_space(index.reader.manifest)
    pooled = space is None or space.get("backend") == "minilm-tokens"
    if pooled and q_vecs.size and q_vecs.shape[-1] == index.reader.dim:
        v = np.asarray(q_vecs, dtype=np.float32).mean(axis=0)
        return v / max(float(np.linalg.norm(v)), 1e-12)
    # another embedder's store (or one that does not name its embedder, with vectors of another size)
    if index.embedder is None:
        return None
    from memlib.retrieve.graphview import query_vector as embedded

    v = embedded(index, query)
    return v / max(float(np.linalg.norm(v)), 1e-12)


def ppr_term(index, frame, mem: MemoryFrame, sims: np.ndarray, seeds: int, seed_kinds: tuple[str, ...],
             max_nodes: int, cfg: GraphConfig | None = None, rows: np.ndarray | None = None) -> np.ndarray | None:
    """Per turn: GAAMA personalized PageRank mass from the ``seeds`` memories of ``seed_kinds``
    nearest the question (weights cos²) among ``rows`` of ``mem`` (None: all; ``sims``: their
    cosines), over the tenant graph: power iteration to ``cfg.tol``, or on a graph of more than
    ``max_nodes`` vertices forward push to a residual of ``cfg.tol`` per unit of degree
    (memlib/retrieve/push.py; its work does not grow with the graph). None without a graph or a
    seed."""
    if seeds <= 0:
        return None
    cand = np.flatnonzero(np.isin(mem.kind if rows is None else mem.kind[rows], seed_kinds) & (sims > 0))
    if cand.size == 0:
        return None
    graph = tenant_graph(index)
    if graph is None:
        return None
    top = cand[np.argsort(-sims[cand], kind="stable")[:seeds]]
    at = top if rows is None else rows[top]
    weights = {mem.node_ids[j]: float(sims[i]) ** 2 for i, j in zip(top.tolist(), at.tolist())}
    cfg = cfg or GraphConfig()
    if graph.num_nodes > max_nodes:
        res = push_ppr(graph.adjacency().indptr, gaama_transition(graph, cfg), graph.vertices(weights),
                       np.fromiter(weights.values(), dtype=np.float64, count=len(weights)), cfg.damping, cfg.tol)
        mass = res.scores / max(float(res.scores.max(initial=0.0)), 1e-300)
    else:
        mass = gaama_ppr_scores(graph, weights, cfg)
    verts = frame_vertices(index, frame, graph)
    return np.where(verts >= 0, mass[np.maximum(verts, 0)], 0.0)


def frame_vertices(index, frame, graph: MemoryGraph) -> np.ndarray:
    """The vertex of each of ``frame``'s turns in ``graph`` (-1: not in it), as ``graph.vertices``
    gives them. The tenant graph's are looked up once per tenant view (a 2,500-session tenant's
    26,738 turns took 47 ms of dict lookups a query), a subgraph's mapped from them by its
    ``parent_index``."""
    root = graph if graph.parent is None else graph.parent
    if len(frame.ids) != len(index.turn_order) or (graph.parent is not None and graph.parent_index is None):
        return graph.vertices(frame.ids)
    pv = index.memo(("frame_vertices", id(root)), lambda: root.vertices(frame.ids))
    if graph.parent is None:
        return pv
    if graph.num_nodes == 0:
        return np.full(pv.size, -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(graph.parent_index, pv), graph.num_nodes - 1)
    return np.where((pv >= 0) & (graph.parent_index[pos] == pv), pos, -1).astype(np.int64)


def _epoch(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def question_windows(frame, query: str, question_time: Any) -> list[tuple[float, float]]:
    """The question's temporal expressions resolved against ``question_time`` (None: the tenant's
    latest turn time) as [start, end) epoch seconds; none without an expression or a turn time."""
    from memlib.retrieve.intent import time_windows

    known = frame.times[np.isfinite(frame.times)]
    if known.size == 0:
        return []
    anchor = _epoch(question_time) or datetime.fromtimestamp(float(known.max()), tz=timezone.utc)
    return [(a.timestamp(), b.timestamp()) for a, b in time_windows(query, anchor)]


def time_term(frame, query: str, question_time: Any) -> tuple[np.ndarray | None, int]:
    """(per turn: whether its session's time falls in a window of the question's temporal
    expressions resolved against ``question_time`` (None: the tenant's latest turn time); None
    when the question has no such expression or no turn has a time, number of windows)."""
    windows = question_windows(frame, query, question_time)
    if not windows:
        return None, 0
    inside = np.zeros(frame.times.size, dtype=bool)
    for a, b in windows:
        inside |= (frame.times >= a) & (frame.times < b)
    return (inside if inside.any() else None), len(windows)


def ranks(score: np.ndarray) -> np.ndarray:
    """1-based rank of each entry of ``score`` (higher first; ties: the earlier position first)."""
    out = np.empty(score.size, dtype=np.float64)
    out[np.argsort(-score, kind="stable")] = np.arange(1, score.size + 1)
    return out


def rrf(score: np.ndarray, k: float, only_positive: bool = False) -> np.ndarray:
    """Reciprocal-rank term 1 / (k + rank) of each entry; with ``only_positive``, 0 where the
    score is not positive (a turn no memory cites gets no vote)."""
    term = 1.0 / (k + ranks(score))
    return np.where(score > 0, term, 0.0) if only_positive else term


def fuse_memory(index, frame, pool: np.ndarray | None, score: np.ndarray, q_vecs: np.ndarray, query: str,
                p: dict[str, Any], only: np.ndarray | None = None, mentions: list[tuple[str, np.ndarray]] = ()
                ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``auto``'s turn ``score`` (standard deviations, over the scored turns: ``pool`` positions of
    ``frame``, or all) plus a reciprocal-rank bonus per memory signal of ``p["memory_signals"]``:
    score + Σ_signal w_signal · k / (k + rank of the turn by the signal), over the turns the
    signal gives a positive value (k ``rank_k``; the top turn of a signal gains w_signal standard
    deviations, the k-th half that). The bonus reads a signal's ranks, not its scale (a cosine, a
    PageRank mass), and the turn score keeps its margins: a plain reciprocal-rank fusion of the
    turn ranking lost LongMemEval evidence that ``auto`` ranks first by a wide margin
    (docs/decisions/0032-auto-reads-memory.md). Signals, weight ``memory_weight``: a kind of
    :data:`VOTE_KINDS` (its best-matching node citing the turn, ``<kind>_vote``) and ``ppr``
    (:func:`ppr_term`), and with ``mentions`` (the events an order or duration question names, their
    tokens among ``q_vecs``: memlib/retrieve/event_time.py) one vote per mention, ``mention_vote_<i>``;
    weight ``time_weight``: ``time`` (the turns in the question's time windows by their session time
    or by the time of an event or fact citing them, ``event_window``, ranked by their score).
    ``only`` (per scored turn, optional): when some but not all turns are marked, the memory votes
    (kinds and ``ppr``, not ``time``) go to the marked turns only, ranked among them: ``auto``
    marks the turns the person the question names speaks (docs/decisions/0037-named-speaker-turns.md).
    Returns (fused score, the signals computed, by name)."""
    raw = p["memory_signals"]
    wanted = [x.strip() for x in raw.split("+")] if isinstance(raw, str) else list(raw)  # "fact+ppr" in a tune grid
    unknown = sorted(set(wanted) - set(VOTE_KINDS) - {"ppr", "time"})
    if unknown:
        raise ValueError(f"auto: unknown memory signal(s) {unknown}; known: {[*VOTE_KINDS, 'ppr', 'time']}")
    k, w, w_time = float(p["rank_k"]), float(p["memory_weight"]), float(p["time_weight"])
    fused = np.array(score, dtype=np.float64)
    out: dict[str, np.ndarray] = {}
    gate = only if only is not None and only.any() and not only.all() else None

    def add(name: str, value: np.ndarray | None, scored: bool = False) -> None:
        nonlocal fused
        if value is None:
            return
        value = value if pool is None or scored else value[pool]
        if gate is not None:
            value = np.where(gate, value, 0.0)
        out[name] = value
        fused = fused + w * k * rrf(value, k, only_positive=True)

    vote_kinds = [s for s in wanted if s in VOTE_KINDS] if w > 0 else []
    seed_kinds = tuple(p["ppr_kinds"]) if "ppr" in wanted and w > 0 else ()
    mentions = mentions if w > 0 else ()
    kinds = tuple(sorted(set(vote_kinds) | set(seed_kinds) | ({"event", "fact"} if mentions else set())))
    if kinds:
        mem = memory_frame(index, frame, kinds)
        qvec = query_vector(index, q_vecs, query)
        # only the memories citing a turn of the scored turns' sessions: the others vote for no scored
        # turn (the votes are the same) and seed no PPR (docs/decisions/0039-local-memory-signals.md)
        rows = mem.citing(None if pool is None else frame.session_turns(pool))
        vectors = mem.vectors if pool is None or not mem.vectors.size else mem.vectors[rows]
        sims = vectors @ qvec if qvec is not None and vectors.size else np.zeros(rows.size)
        for kind in vote_kinds:
            add(f"{kind}_vote", mem.votes_at(pool, rows, sims, kind), scored=True)
        if seed_kinds:
            add("ppr", ppr_term(index, frame, mem, sims, int(p["ppr_seeds"]), seed_kinds, int(p["ppr_max_nodes"]),
                                rows=None if pool is None else rows))
        mention_vecs = [query_vector(index, q_vecs[mask], text) if mask.any() else None for text, mask in mentions]
        for name, votes in mention_votes(mem, (pool, rows), vectors, mention_vecs):
            add(name, votes, scored=True)
    windows = question_windows(frame, query, p.get("question_time")) if "time" in wanted and w_time > 0 else []
    if windows:
        inside = np.zeros(frame.times.size, dtype=bool)
        for a, b in windows:
            inside |= (frame.times >= a) & (frame.times < b)
        sub = inside if pool is None else inside[pool]
        dated = event_window(index, memory_frame(index, frame, ("event", "fact")), windows, pool)
        if dated is not None and (dated & ~sub).any():
            out["event_window"] = dated.astype(np.float64)
            sub = sub | dated
        if sub.any():
            # the turns in the question's windows, ranked among themselves by their score
            out["time_window"] = sub.astype(np.float64)
            in_window = np.where(sub, score - float(score.min()) + 1.0, 0.0)
            fused = fused + w_time * k * rrf(in_window, k, only_positive=True)
    return fused, out

