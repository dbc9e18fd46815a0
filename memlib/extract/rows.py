"""The rows every extraction backend writes: node ids, typed attributes, node and edge rows.

Heuristic and LLM backends of one extraction build their nodes through the same functions, so
a fact, concept, event, triplet or reflection has the same id scheme, the same columns and
the same ``attributes`` keys whichever backend wrote it (the keys the other extractions read
are :data:`memlib.extract.contract.CONTRACT`).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from typing import Any

from memlib.ids import make_id
from memlib.schema import EdgeKind, NodeKind


def normalized(text: str) -> str:
    """``text`` with runs of whitespace collapsed (what an id built from a text reads)."""
    return " ".join(text.split())


def fact_id(tenant_id: str, turn_node_id: str, index: int, text: str) -> str:
    """The ``index``-th fact drawn from a turn (its first source turn when it has several)."""
    return make_id(NodeKind.FACT, tenant_id, turn_node_id, index, text)


def concept_id(tenant_id: str, key: str) -> str:
    """A tenant's concept by its canonical key (:func:`memlib.extract.concepts.token_key`)."""
    return make_id(NodeKind.CONCEPT, tenant_id, key)


def event_id(tenant_id: str, source_id: str, text: str | None = None) -> str:
    """An event drawn from ``source_id`` (a fact, or the first source turn with its text)."""
    if text is None:
        return make_id(NodeKind.EVENT, tenant_id, source_id)
    return make_id(NodeKind.EVENT, tenant_id, source_id, normalized(text))


def triplet_id(tenant_id: str, turn_node_id: str, subject: str, relation: str, obj: str) -> str:
    return make_id(NodeKind.TRIPLET, tenant_id, turn_node_id, subject, relation, obj)


def reflection_id(tenant_id: str, *scope: str) -> str:
    """A reflection over a theme (speaker + concept) or a text (conversation + text)."""
    return make_id(NodeKind.REFLECTION, tenant_id, *scope)


class Attributes:
    """Typed ``attributes`` of one node kind; optional fields left ``None`` are not written."""

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict, lists and dicts copied (what ``dataclasses.asdict`` gives for
        these flat records, at a fraction of its cost: a 2,500-session tenant writes ~36k rows)."""
        names, keep = _layout(type(self))
        out = {}
        for k in names:
            v = getattr(self, k)
            if k in keep or v is not None:
                out[k] = _copied(v)
        return out

    @classmethod
    def contract(cls) -> tuple[str, ...]:
        """The keys every node of the kind carries (the fields without a ``None`` default)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.default is not None)


@functools.cache
def _layout(cls: type) -> tuple[tuple[str, ...], frozenset[str]]:
    """The field names of an :class:`Attributes` class and those of its contract."""
    return tuple(f.name for f in dataclasses.fields(cls)), frozenset(cls.contract())


def _copied(value: Any) -> Any:
    """``value`` with its lists, tuples and dicts copied all the way down (as ``asdict`` does)."""
    if isinstance(value, list):
        return [_copied(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_copied(v) for v in value)
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


@dataclass
class FactAttributes(Attributes):
    speaker: str | None = ""
    turn_id: str | None = ""
    dates_mentioned: list[Any] = field(default_factory=list)
    dated_by_mention: bool = False
    entities: list[str] = field(default_factory=list)
    topic: str | None = ""
    concepts: list[str] = field(default_factory=list)
    concept_ids: list[str] = field(default_factory=list)

    @staticmethod
    def topic_of(concepts: Sequence[str]) -> str | None:
        return concepts[0].replace("_", " ") if concepts else None


@dataclass
class ConceptAttributes(Attributes):
    label: str = ""
    aliases: list[str] | None = None
    n_facts: int | None = None


@dataclass
class EventAttributes(Attributes):
    entities: list[str] = field(default_factory=list)
    topic: str | None = ""
    dates_mentioned: list[Any] = field(default_factory=list)


@dataclass
class TripletAttributes(Attributes):
    subject: str = ""
    relation: str = ""
    object: str = ""


@dataclass
class ReflectionAttributes(Attributes):
    facts: list[str] = field(default_factory=list)
    speaker: str | None = None
    concept: str | None = None
    concept_id: str | None = None
    n_facts: int | None = None
    sessions: int | None = None


@dataclass
class NodeRow:
    """One ``NODES_NO_EMBEDDING`` row of a derived node, as an extractor makes it; :meth:`row` is
    the dict :func:`memlib.extract.tables.node_table` takes (``attributes`` serialized there)."""
    kind: NodeKind
    node_id: str
    tenant_id: str
    text: str
    provenance: list[str]
    attributes: Attributes | dict[str, Any]
    _: KW_ONLY
    conversation_id: str | None = None
    session_id: str | None = None
    time: datetime | None = None
    valid_from: datetime | None = None
    belief: float | None = None

    def row(self) -> dict[str, Any]:
        attrs = self.attributes.to_dict() if isinstance(self.attributes, Attributes) else self.attributes
        row = {"node_id": self.node_id, "tenant_id": self.tenant_id, "kind": self.kind.value, "text": self.text,
               "provenance": self.provenance, "attributes": attrs, "conversation_id": self.conversation_id,
               "session_id": self.session_id, "time": self.time, "valid_from": self.valid_from}
        if self.belief is not None:
            row["belief"] = self.belief
        return row


def edge_row(tenant_id: str, src: str, dst: str, kind: EdgeKind, provenance: list[str],
             relation: str | None = None) -> dict[str, Any]:
    return {"tenant_id": tenant_id, "src": src, "dst": dst, "kind": kind, "provenance": provenance,
            "relation": relation}


def derived_from(tenant_id: str, src: str, turns: Iterable[str]) -> list[dict[str, Any]]:
    """DERIVED_FROM edges from a derived node to each of its source turns."""
    return [edge_row(tenant_id, src, t, EdgeKind.DERIVED_FROM, [t]) for t in turns]


def concept_links(tenant_id: str, fact: str, concept: str, turns: list[str]) -> list[dict[str, Any]]:
    """HAS_CONCEPT (each source turn -> concept) and ABOUT_CONCEPT (fact -> concept)."""
    return ([edge_row(tenant_id, t, concept, EdgeKind.HAS_CONCEPT, [t]) for t in turns]
            + [edge_row(tenant_id, fact, concept, EdgeKind.ABOUT_CONCEPT, list(turns))])


def mentions(tenant_id: str, src: str, entity_ids: Iterable[str], provenance: list[str]) -> list[dict[str, Any]]:
    return [edge_row(tenant_id, src, e, EdgeKind.MENTIONS, provenance) for e in dict.fromkeys(entity_ids)]
