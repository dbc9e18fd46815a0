"""Entity mentions, per-tenant canonical keys and cited descriptions (MemORAI / PersonalAI)."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from memlib.ids import make_id
from memlib.schema import NodeKind

ENTITY_LABELS = frozenset({"PERSON", "ORG", "GPE", "LOC", "EVENT", "WORK_OF_ART", "PRODUCT", "NORP", "FAC"})
_POSSESSIVE = re.compile(r"(?:'s|’s|'|’)$")
_LEADING = re.compile(r"^(?:the|a|an)\s+", re.IGNORECASE)


def entity_key(name: str) -> str:
    """Canonical key: lowercase, collapsed whitespace, no possessive, no leading article."""
    key = " ".join(name.split()).strip(" .,;:!?\"'")
    key = _POSSESSIVE.sub("", key)
    return _LEADING.sub("", key).lower()


def entity_id(tenant_id: str, name: str) -> str:
    return make_id(NodeKind.ENTITY, tenant_id, entity_key(name))


@dataclass
class EntityAcc:
    """Everything gathered about one canonical entity of one tenant."""
    tenant_id: str
    key: str
    names: Counter[str] = field(default_factory=Counter)
    labels: Counter[str] = field(default_factory=Counter)
    cites: list[tuple[str, str, str]] = field(default_factory=list)  # (turn node id, turn_id, sentence)

    @property
    def node_id(self) -> str:
        return make_id(NodeKind.ENTITY, self.tenant_id, self.key)

    def name(self) -> str:
        return sorted(self.names.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]

    def description(self, cap: int) -> str:
        """Sentences that mention the entity, each citing its source turn id, capped at ``cap`` chars."""
        out, seen, size = [], set(), 0
        for _, turn_id, sentence in self.cites:
            if sentence in seen:
                continue
            piece = f"{sentence} [{turn_id}]"
            if size + len(piece) > cap and out:
                break
            out.append(piece[:cap])
            seen.add(sentence)
            size += len(piece) + 1
        return " ".join(out)

    def node_row(self, cap: int) -> dict[str, Any]:
        name, desc = self.name(), self.description(cap)
        turns = sorted({c[0] for c in self.cites})
        return {"node_id": self.node_id, "tenant_id": self.tenant_id, "kind": NodeKind.ENTITY.value,
                "text": f"{name}: {desc}" if desc else name, "provenance": turns,
                "attributes": {"name": name, "label": self.labels.most_common(1)[0][0] if self.labels else None,
                               "aliases": sorted(self.names), "description": desc,
                               "turn_ids": sorted({c[1] for c in self.cites})}}


class EntityIndex:
    """Per-tenant accumulator of entities keyed by canonical key."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], EntityAcc] = {}

    def add(self, tenant_id: str, name: str, label: str, cite: tuple[str, str, str] | None) -> str | None:
        key = entity_key(name)
        if len(key) < 2:
            return None
        acc = self.items.setdefault((tenant_id, key), EntityAcc(tenant_id, key))
        acc.names[" ".join(_POSSESSIVE.sub("", name).split())] += 1
        acc.labels[label] += 1
        if cite is not None:
            acc.cites.append(cite)
        return acc.node_id

    def lookup(self, tenant_id: str, name: str) -> str | None:
        acc = self.items.get((tenant_id, entity_key(name)))
        return acc.node_id if acc else None

    def rows(self, cap: int) -> list[dict[str, Any]]:
        return [acc.node_row(cap) for _, acc in sorted(self.items.items())]
