"""Read-only views of one tenant for people and agents looking around a search hit: the turns
of a session (optionally a window around one turn) and the small graph of nodes derived from a
node (facts, entities, events, concepts and the edges among them).

Both work on a pinned :class:`~memlib.retrieve.tenant.TenantIndex`, so they answer from the
same store version as the search that produced the hit."""
from __future__ import annotations

from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from memlib.retrieve.tenant import TenantIndex
from memlib.schema import EdgeKind
from memlib.serve.errors import ApiError, ErrorCode
from memlib.serve.models import GraphEdge, GraphNode, NodeGraphResponse, SessionResponse, SessionTurn

# edges that tie a node into the conversation's skeleton rather than into its meaning; left out
# of the derived graph unless asked for (a turn's NEXT chain and segment would crowd it out)
STRUCTURAL = frozenset({EdgeKind.NEXT.value, EdgeKind.IN_SEGMENT.value, EdgeKind.IN_SESSION.value,
                        EdgeKind.SIMILAR.value, EdgeKind.HAS_CLUE.value})
MAX_SESSION_TURNS = 500
MAX_WINDOW = 200
MAX_DEPTH = 3
MAX_GRAPH_NODES = 200
TEXT_CHARS = 400


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def _check_range(name: str, value: int, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError(ErrorCode.BAD_ARGUMENT, f"{name}={value!r} is outside {low}..{high}")
    return value


# -- sessions ---------------------------------------------------------------------------------
def session_view(index: TenantIndex, session_id: str, around: str | None = None,
                 window: int = 5) -> SessionResponse:
    """The turns of ``session_id`` in order; with ``around`` (a turn id such as ``D1:3`` or a turn
    node id) only ``window`` turns either side of it."""
    window = _check_range("window", window, 0, MAX_WINDOW)
    order = [nid for nid in index.turn_order if index.turns[nid].session_id == session_id]
    if not order:
        raise ApiError(ErrorCode.UNKNOWN_SESSION, f"no session {session_id!r} in tenant {index.tenant!r}")
    focus = None
    lo, hi = 0, min(len(order), MAX_SESSION_TURNS)
    if around is not None:
        pos = next((i for i, nid in enumerate(order) if around in (nid, index.turns[nid].turn_id)), None)
        if pos is None:
            raise ApiError(ErrorCode.UNKNOWN_NODE, f"turn {around!r} is not in session {session_id!r}")
        focus = order[pos]
        lo, hi = max(0, pos - window), min(len(order), pos + window + 1)
    turns = [SessionTurn(node_id=nid, turn_id=index.turns[nid].turn_id, speaker=index.turns[nid].speaker,
                         text=index.turns[nid].text, position=i)
             for i, nid in enumerate(order[lo:hi], start=lo)]
    return SessionResponse(tenant=index.tenant, version=index.version, session_id=session_id,
                           time=_iso(index.turns[order[0]].time), n_turns=len(order), focus=focus, turns=turns)


# -- derived graph ----------------------------------------------------------------------------
EDGE_COLUMNS = ["src", "dst", "kind", "relation", "weight"]


def tenant_edges(index: TenantIndex) -> pa.Table:
    """The tenant's edges table, read once per :class:`TenantIndex` (so once per store version)."""
    return index.memo("edges", lambda: index.reader.table("edges", index.tenant,
                                                           columns=EDGE_COLUMNS).combine_chunks())


def resolve_node(index: TenantIndex, node: str) -> str:
    """A node id of the tenant, from a node id or a source turn id (``D1:3``)."""
    if node in index.row_of:
        return node
    nid = index.turn_by_source.get(node)
    if nid is None:
        raise ApiError(ErrorCode.UNKNOWN_NODE, f"no node or turn {node!r} in tenant {index.tenant!r}")
    return nid


def _kind(index: TenantIndex, node: str) -> str:
    return str(index.kinds[index.row_of[node]])


def _touching(edges: pa.Table, nodes: list[str]) -> pa.Table:
    ids = pa.array(nodes, type=pa.string())
    return edges.filter(pc.or_(pc.is_in(edges["src"], value_set=ids), pc.is_in(edges["dst"], value_set=ids)))


def _bfs(index: TenantIndex, edges: pa.Table, center: str, depth: int, limit: int) -> tuple[dict[str, int], bool]:
    """Hop distance of the nodes reached from ``center`` (at most ``limit``, derived nodes before
    turns at each hop). Turns other than the centre are leaves: expanding them would pull in
    their own derived nodes."""
    hops = {center: 0}
    frontier = [center]
    for hop in range(1, depth + 1):
        near = _touching(edges, frontier)
        found = set(near["src"].to_pylist()) | set(near["dst"].to_pylist())
        new = sorted((n for n in found if n not in hops and n in index.row_of),
                     key=lambda n: (n in index.turns, _kind(index, n), n))
        room = limit - len(hops)
        if len(new) > room:
            hops.update((n, hop) for n in new[:room])
            return hops, True
        hops.update((n, hop) for n in new)
        frontier = [n for n in new if n not in index.turns]
        if not frontier:
            break
    return hops, False


def _graph_node(index: TenantIndex, node: str, hops: int) -> GraphNode:
    row = index.row_of[node]
    turns = [index.turns[t].turn_id for t in index.turns_of(node)]
    return GraphNode(node_id=node, kind=str(index.kinds[row]), text=index.texts[row][:TEXT_CHARS],
                     time=_iso(index.times[row]), session_id=index.session_ids[row], turn_ids=turns, hops=hops)


def node_graph(index: TenantIndex, node: str, depth: int = 2, limit: int = 40,
               structural: bool = False) -> NodeGraphResponse:
    """The nodes within ``depth`` edges of ``node`` (facts, entities, events, concepts derived from a
    turn, and so on) and every edge among them; skeleton edges (NEXT, IN_SEGMENT, IN_SESSION,
    SIMILAR, HAS_CLUE) only with ``structural``."""
    depth = _check_range("depth", depth, 1, MAX_DEPTH)
    limit = _check_range("limit", limit, 1, MAX_GRAPH_NODES)
    center = resolve_node(index, node)
    edges = tenant_edges(index)
    if not structural:
        edges = edges.filter(pc.invert(pc.is_in(edges["kind"], value_set=pa.array(sorted(STRUCTURAL)))))
    hops, truncated = _bfs(index, edges, center, depth, limit)
    ids = pa.array(list(hops), type=pa.string())
    inner = edges.filter(pc.and_(pc.is_in(edges["src"], value_set=ids), pc.is_in(edges["dst"], value_set=ids)))
    out_edges = [GraphEdge(**row) for row in inner.to_pylist()]
    nodes = [_graph_node(index, n, h) for n, h in hops.items()]
    return NodeGraphResponse(tenant=index.tenant, version=index.version, center=center, nodes=nodes,
                             edges=out_edges, truncated=truncated)
