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


def alias(name: str) -> str:
    """The name an :class:`EntityAcc` counts for a mention's name."""
    return " ".join(_POSSESSIVE.sub("", name).split())


def entity_rows(tenant_id: str, mentions: Any, cap: int) -> list[dict[str, Any]]:
    """``EntityIndex.rows`` of ``mentions`` (a polars frame in mention order: key, name, label,
    turn_node_id, turn_id, sentence; keys of two characters or more), computed per column: the
    name is the most frequent alias (the smallest of those tied), the label the most frequent
    (the first seen of those tied), the description the first distinct citing sentences."""
    import polars as pl

    m = mentions.with_row_index("_i").with_columns(
        pl.col("name").replace_strict({n: alias(n) for n in mentions["name"].unique().to_list()},
                                      return_dtype=pl.String).alias("alias"))
    names = (m.group_by("key", "alias").agg(pl.len().alias("n"))
             .sort(["key", "n", "alias"], descending=[False, True, False])
             .group_by("key", maintain_order=True).agg(pl.col("alias").first().alias("name"),
                                                       pl.col("alias").sort().alias("aliases")))
    labels = (m.group_by("key", "label").agg(pl.len().alias("n"), pl.col("_i").min().alias("first"))
              .sort(["key", "n", "first"], descending=[False, True, False])
              .group_by("key", maintain_order=True).agg(pl.col("label").first()))
    cited = m.filter(pl.col("turn_node_id").is_not_null())
    turns = cited.group_by("key").agg(pl.col("turn_node_id").unique().sort().alias("turns"),
                                      pl.col("turn_id").unique().sort().alias("turn_ids"))
    pieces: dict[str, list[tuple[str | None, str | None]]] = {}
    for key, turn_id, sentence in (cited.unique(subset=["key", "sentence"], keep="first", maintain_order=True)
                                   .select("key", "turn_id", "sentence").iter_rows()):
        pieces.setdefault(key, []).append((turn_id, sentence))
    rows = names.join(labels, on="key").join(turns, on="key", how="left").sort("key")
    out = []
    for r in rows.iter_rows(named=True):
        acc = EntityAcc(tenant_id, r["key"])
        acc.cites = [(None, t, s) for t, s in pieces.get(r["key"], [])]  # type: ignore[misc]
        desc = acc.description(cap)
        name = r["name"]
        out.append({"node_id": acc.node_id, "tenant_id": tenant_id, "kind": NodeKind.ENTITY.value,
                    "text": f"{name}: {desc}" if desc else name, "provenance": r["turns"] or [],
                    "attributes": {"name": name, "label": r["label"], "aliases": r["aliases"], "description": desc,
                                   "turn_ids": r["turn_ids"] or []}})
    return out
