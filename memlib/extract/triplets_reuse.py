"""The triplets step after a run that only added or removed turns: entities rebuilt only where their mentions changed.

Equal to :meth:`memlib.extract.triplets.HeuristicTriplets.finish` over the same drafts (nodes in
the same order, the same edges; docs/decisions/0035-incremental-canonicalization.md):

- an entity row is a function of its key's mentions in session order (names, labels, citing
  sentences). It is built again, from every current mention of its key, when one of them is in
  a dirty session (:attr:`Prior.dirty`), when its key is a speaker of a dirty session (a turn's
  speaker mentions cite no turn), when its published row cites a turn of a dirty session, or
  when it was not published; every other entity's mentions are the published ones, in the same
  order, and its published row is copied;
- a triplet keeps its published row when its session is unchanged (its row is a function of
  its draft), else it is built;
- MENTIONS (turn, triplet and fact -> entity), DERIVED_FROM and RELATION edges are made again
  from the drafts in columns, every name resolved through the same keys as the entity index.
"""
from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.extract.base import ExtractResult
from memlib.extract.entities import entity_key, entity_rows
from memlib.extract.prior import Prior, assemble, edge_frame, merged_edges, positions, take_rows
from memlib.extract.tables import node_table
from memlib.extract.triplets import triplet_node
from memlib.ids import make_id
from memlib.schema import EdgeKind, NodeKind

_ENTITIES = pl.Struct({"entities": pl.List(pl.String)})


class _Keys:
    """Entity ids of names, through the keys the entity index gives them (cached per name)."""

    def __init__(self, tenant: str, mentions: pl.DataFrame) -> None:
        self.tenant = tenant
        self.key_of: dict[str, str] = {}
        keys = self.keys(mentions["name"])
        self.present = frozenset(k for k in keys.unique().to_list() if len(k) >= 2)
        self.id_of = {k: make_id(NodeKind.ENTITY, tenant, k) for k in self.present}

    def keys(self, names: pl.Series) -> pl.Series:
        todo = [n for n in names.drop_nulls().unique().to_list() if n not in self.key_of]
        self.key_of.update((n, entity_key(n)) for n in todo)
        return names.replace_strict(self.key_of, default=None, return_dtype=pl.String)

    def ids(self, names: pl.Series) -> pl.Series:
        """Per name: the id of its entity, null when the index has none (as ``EntityIndex.lookup``)."""
        return self.keys(names).replace_strict(self.id_of, default=None, return_dtype=pl.String)


def finish_reusing(mentions: pa.Table, triplets: pa.Table, facts: pl.DataFrame | None, cap: int,
                   prior: Prior) -> tuple[ExtractResult, int]:
    """``HeuristicTriplets.finish`` of one tenant's drafts, reusing ``prior``, and how many of its
    nodes are published rows copied. ``facts``: the tenant's facts' entity names
    (:func:`fact_entities`), None when the build has no facts."""
    mentions = schema.conform(mentions, schema.ENTITY_MENTIONS, name="entity_mentions")
    triplets = schema.conform(triplets, schema.TRIPLET_DRAFTS, name="triplet_drafts")
    tenants = {*mentions.column("tenant_id").unique().to_pylist(), *triplets.column("tenant_id").unique().to_pylist()}
    if len(tenants) > 1:
        raise ValueError(f"triplets: a reused build is of one tenant, got {sorted(tenants)}")
    if not tenants:
        return ExtractResult(schema.empty(schema.NODES_NO_EMBEDDING), schema.empty(schema.EDGES)), 0
    tenant = tenants.pop()
    m = pl.from_arrow(mentions.select(["name", "label", "turn_node_id", "turn_id", "sentence"]))
    keys = _Keys(tenant, m)
    m = m.with_columns(keys.keys(m["name"]).alias("key"), keys.ids(m["name"]).alias("eid"))
    t = pl.from_arrow(triplets.select(["node_id", "turn_node_id", "relation", "subject_entity", "object_entity"]))
    t = t.with_columns(keys.ids(t["subject_entity"]).alias("s"), keys.ids(t["object_entity"]).alias("o"))
    (found, copied_triplets), (entities, copied_entities) = (_triplet_nodes(triplets, prior),
                                                              _entity_nodes(m, keys, cap, prior))
    nodes = pa.concat_tables([found, entities])
    cited = m.filter(pl.col("turn_node_id").is_not_null() & pl.col("eid").is_not_null())
    prov = pl.concat_list("turn_node_id")
    parts = [edge_frame(tenant, (pl.col("turn_node_id"), pl.col("eid")), EdgeKind.MENTIONS, prov, cited),
             edge_frame(tenant, (pl.col("node_id"), pl.col("turn_node_id")), EdgeKind.DERIVED_FROM, prov, t),
             edge_frame(tenant, (pl.col("node_id"), pl.col("s")), EdgeKind.MENTIONS, prov,
                        t.filter(pl.col("s").is_not_null())),
             edge_frame(tenant, (pl.col("node_id"), pl.col("o")), EdgeKind.MENTIONS, prov,
                        t.filter(pl.col("o").is_not_null() & pl.col("s").ne_missing(pl.col("o")))),
             edge_frame(tenant, (pl.col("s"), pl.col("o")), EdgeKind.RELATION, prov,
                        t.filter(pl.col("s").is_not_null() & pl.col("o").is_not_null() & (pl.col("s") != pl.col("o"))),
                        relation=pl.col("relation"))]
    if keys.present:
        parts.append(_fact_mentions(facts, keys, tenant))
    return ExtractResult(nodes, merged_edges(parts)), copied_triplets + copied_entities


def _triplet_nodes(triplets: pa.Table, prior: Prior) -> tuple[pa.Table, int]:
    """Every draft's triplet row, in draft order: the published one when its session is unchanged."""
    published = prior.of_kind(NodeKind.TRIPLET)
    at = positions(triplets.column("node_id"), published.column("node_id"))
    copy = prior.clean(triplets.column("conversation_id"), triplets.column("session_id")) & (at >= 0)
    copied, redo = np.flatnonzero(copy), np.flatnonzero(~copy)
    built = node_table([triplet_node(r) for r in take_rows(triplets, redo).to_pylist()])
    return assemble(take_rows(published, at[copied]), copied, built, redo), int(copied.size)


def _entity_nodes(m: pl.DataFrame, keys: _Keys, cap: int, prior: Prior) -> tuple[pa.Table, int]:
    """One row per entity key, in key order (as ``EntityIndex.rows``)."""
    published = prior.of_kind(NodeKind.ENTITY)
    touched = set(m.filter(pl.col("turn_node_id").is_in(list(prior.dirty_turns)))["key"].drop_nulls().to_list())
    touched.update(entity_key(s) for s in prior.dirty_speakers)
    cites = pl.from_arrow(published.select(["node_id", "provenance"])).explode("provenance")
    stale = set(cites.filter(pl.col("provenance").is_in(list(prior.dirty_turns)))["node_id"].to_list())
    known = set(published.column("node_id").to_pylist())
    order = sorted(keys.present)
    redo_keys = [k for k in order if k in touched or keys.id_of[k] in stale or keys.id_of[k] not in known]
    built = node_table(entity_rows(keys.tenant, m.filter(pl.col("key").is_in(redo_keys)), cap) if redo_keys else [])
    redo = set(redo_keys)
    at = {k: i for i, k in enumerate(order)}
    copy_keys = [k for k in order if k not in redo]
    prows = positions(pa.array([keys.id_of[k] for k in copy_keys], pa.string()), published.column("node_id"))
    return assemble(take_rows(published, prows), np.array([at[k] for k in copy_keys], np.int64), built,
                    np.array([at[k] for k in redo_keys], np.int64)), len(copy_keys)


def fact_entities(facts: pa.Table) -> pl.DataFrame:
    """(node_id, provenance, names) of the fact nodes of ``facts``: the names of their ``entities``
    attribute, as ``triplets._fact_mentions`` reads them."""
    facts = facts.filter(pc.equal(facts.column("kind"), NodeKind.FACT.value))
    names = pl.col("attributes").str.json_decode(_ENTITIES).struct.field("entities")
    return pl.from_arrow(facts.select(["node_id", "provenance", "attributes"])).select(
        "node_id", "provenance", names.alias("names"))


def _fact_mentions(facts: pl.DataFrame | None, keys: _Keys, tenant: str) -> pl.DataFrame:
    """MENTIONS fact -> entity for each fact's entity names (:func:`fact_entities`)."""
    if facts is None or facts.height == 0:
        return pl.DataFrame()
    f = facts.explode("names").drop_nulls("names")
    f = f.with_columns(keys.ids(f["names"]).alias("eid")).filter(pl.col("eid").is_not_null())
    return edge_frame(tenant, (pl.col("node_id"), pl.col("eid")), EdgeKind.MENTIONS, pl.col("provenance"), f)
