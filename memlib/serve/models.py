"""Request and response models of the HTTP API (shared by the service and the client)."""
from __future__ import annotations

from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field

MAX_QUERY_CHARS = 4_000
QUESTION_TIME_DOC = ("ISO 8601 time the question is asked at (2023-05-08, 2023-05-08T13:56:00Z); `auto` resolves "
                     "relative dates in the question ('two months ago', 'last Wednesday') against it "
                     "(default: the tenant's latest turn time)")


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(..., description="tenant id (letters, digits, '.', '_', '-')")
    query: str = Field(..., min_length=1, max_length=MAX_QUERY_CHARS, description="the question")
    strategy: str | None = Field(None, description="retrieval strategy (default: retrieve.default_strategy)")
    k: int | None = Field(None, description="nodes to return, 1..serve.max_k (default: retrieve.k)")
    question_time: str | None = Field(None, max_length=64, description=QUESTION_TIME_DOC)


class ResultNode(BaseModel):
    node_id: str
    kind: str
    text: str
    score: float
    signals: dict[str, float] = Field(default_factory=dict, description="the scores behind `score`")
    provenance: list[str] = Field(default_factory=list, description="source turn node ids")
    turn_ids: list[str] = Field(default_factory=list, description="source turn ids, e.g. D1:3")
    session_ids: list[str] = Field(default_factory=list)
    times: list[str | None] = Field(default_factory=list, description="ISO 8601 session times of the turns")


class TurnHit(BaseModel):
    node_id: str
    turn_id: str
    session_id: str
    time: str | None
    speaker: str | None = None
    text: str
    via: str = Field(..., description="the best-ranked result node that cited this turn")


class SearchResponse(BaseModel):
    tenant: str
    query: str
    strategy: str
    k: int
    version: str = Field(..., description="store version every part of this answer was read from")
    results: list[ResultNode]
    turns: list[TurnHit]
    context: str = Field(..., description="packed context with node ids, turn ids and times")
    search_ms: float = Field(..., description="strategy + provenance time")
    latency_ms: float = Field(..., description="server-side handling time of the request")


class TenantsResponse(BaseModel):
    version: str
    tenants: list[str]


class HealthResponse(BaseModel):
    status: str = Field(..., description="ok, or degraded when some tenants cannot be served (see broken)")
    version: str
    tenants: int
    cached_tenants: int
    strategies: list[str]
    broken: dict[str, str] = Field(default_factory=dict, description="tenant -> why it cannot be served")


class ReloadResponse(BaseModel):
    changed: bool
    version: str
    previous: str


class SessionTurn(BaseModel):
    node_id: str
    turn_id: str
    speaker: str | None
    text: str
    position: int = Field(..., description="0-based position of the turn in its session")


class SessionResponse(BaseModel):
    tenant: str
    version: str
    session_id: str
    time: str | None = Field(..., description="ISO 8601 session time")
    n_turns: int = Field(..., description="turns in the whole session")
    focus: str | None = Field(None, description="node id of the turn the window is centred on")
    turns: list[SessionTurn] = Field(..., description="the session's turns (or the window around `focus`), in order")


class GraphNode(BaseModel):
    node_id: str
    kind: str
    text: str
    time: str | None
    session_id: str | None
    turn_ids: list[str] = Field(default_factory=list, description="source turn ids through provenance")
    hops: int = Field(..., description="edges from the centre node")


class GraphEdge(BaseModel):
    src: str
    dst: str
    kind: str
    relation: str | None = None
    weight: float | None = None


class NodeGraphResponse(BaseModel):
    tenant: str
    version: str
    center: str = Field(..., description="node id of the centre node")
    nodes: list[GraphNode]
    edges: list[GraphEdge] = Field(..., description="edges among `nodes`")
    truncated: bool = Field(..., description="more nodes were within `depth` than `limit` allowed")


class ErrorResponse(BaseModel):
    error: str
    reason: str


def search_response(result: Any, version: str, k: int, latency_ms: float,
                    speakers: Mapping[str, str | None] | None = None) -> SearchResponse:
    """A :class:`SearchResponse` from a ``memlib.retrieve.base.SearchResult`` (``speakers``: turn
    node id -> speaker)."""
    d = result.to_dict()
    if speakers:
        for turn in d["turns"]:
            turn["speaker"] = speakers.get(turn["node_id"])
    return SearchResponse(tenant=d["tenant"], query=d["query"], strategy=d["strategy"], k=k, version=version,
                          results=d["nodes"], turns=d["turns"], context=d["context"],
                          search_ms=round(d["latency_ms"], 3), latency_ms=round(latency_ms, 3))
