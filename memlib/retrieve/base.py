"""Result types and the strategy protocol shared by every retrieval strategy.

A strategy turns a question into ranked :class:`RetrievedNode` objects for one tenant;
:func:`memlib.retrieve.kernels.run_search` expands them to source turns through
provenance, packs a context and times the call, giving a :class:`SearchResult`. The
evaluation harness, ``memlib query`` and the HTTP service all go through that one path.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover - typing only
    from memlib.retrieve.tenant import TenantIndex


@dataclass
class RetrievedNode:
    """One ranked node with the signals that produced its score and its provenance."""

    node_id: str
    kind: str
    text: str
    score: float
    signals: dict[str, float] = field(default_factory=dict)
    provenance: list[str] = field(default_factory=list)     # turn node ids
    turn_ids: list[str] = field(default_factory=list)       # source turn ids, e.g. "D1:3"
    session_ids: list[str] = field(default_factory=list)
    times: list[datetime | None] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        # field by field, not dataclasses.asdict: its recursive deepcopy cost ~2.7 ms per
        # 10-node answer, a fifth of a query's CPU in the service
        return {"node_id": self.node_id, "kind": self.kind, "text": self.text, "score": self.score,
                "signals": dict(self.signals), "provenance": list(self.provenance),
                "turn_ids": list(self.turn_ids), "session_ids": list(self.session_ids),
                "times": [t.isoformat() if t is not None else None for t in self.times]}


@dataclass
class RankedTurn:
    """A source turn reached through provenance, in rank order."""

    node_id: str
    turn_id: str
    session_id: str
    time: datetime | None
    text: str
    via: str  # node id of the first (best-ranked) node that cited this turn

    def to_dict(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "turn_id": self.turn_id, "session_id": self.session_id,
                "time": self.time.isoformat() if self.time is not None else None, "text": self.text,
                "via": self.via}


@dataclass
class SearchResult:
    strategy: str
    tenant: str
    query: str
    nodes: list[RetrievedNode]
    turns: list[RankedTurn]
    latency_ms: float
    context: str

    @property
    def turn_ids(self) -> list[str]:
        return [t.turn_id for t in self.turns]

    @property
    def session_ids(self) -> list[str]:
        """Distinct sessions in the order their first turn is ranked."""
        return list(dict.fromkeys(t.session_id for t in self.turns))

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy, "tenant": self.tenant, "query": self.query,
            "latency_ms": self.latency_ms, "context": self.context,
            "nodes": [n.to_dict() for n in self.nodes],
            "turns": [t.to_dict() for t in self.turns],
        }


@runtime_checkable
class Strategy(Protocol):
    """What the registry hands out. ``params`` are the strategy's documented defaults
    merged with ``cfg.retrieve.params[name]``; per-call ``**params`` override both."""

    name: ClassVar[str]
    params: dict[str, Any]

    def search(self, tenant: "TenantIndex", query: str, k: int, **params: Any) -> list[RetrievedNode]:
        ...


class RetrievalError(ValueError):
    """A request a strategy cannot serve (unknown strategy, bad parameter, missing index)."""


class StrategyBase:
    """Convenience base: holds merged params and validates per-call overrides.

    Subclasses set ``name`` (via the registry decorator) and ``defaults`` — every tunable
    number lives there, documented, never buried in the search code."""

    name: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, params: dict[str, Any] | None = None):
        self.params = self.merge(params or {})

    def merge(self, overrides: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(overrides) - set(self.defaults))
        if unknown:
            raise RetrievalError(f"strategy {self.name!r}: unknown parameter(s) {unknown}; "
                                 f"known: {sorted(self.defaults)}")
        merged = dict(self.defaults)
        merged.update(overrides)
        return merged

    def call_params(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """Params of one call: instance params updated by the call's overrides."""
        if not overrides:
            return self.params
        self.merge(overrides)  # validates the names
        merged = dict(self.params)
        merged.update(overrides)
        return merged
