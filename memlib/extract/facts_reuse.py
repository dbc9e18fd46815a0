"""The facts step after a run that only added or removed turns: published canon extended, rows copied.

Equal to :func:`memlib.extract.facts.finish_drafts` over the same drafts (nodes in the same order,
the same edges; docs/decisions/0035-incremental-canonicalization.md):

- clusters: when only new sessions were added (:attr:`Prior.extends`), the published concepts'
  aliases are clusters already known, and only the labels of no published concept are compared
  with the others (:func:`memlib.extract.concepts.cluster` with ``groups``: a new label that
  joins a cluster or bridges two is found there); after a removal or a changed session every
  label is clustered again (a removed label can split a cluster);
- a cluster's canonical label is its most frequent over every draft (counted in columns), the
  smallest of those tied, as in a full build;
- a fact keeps its published row when its session is unchanged and its concepts (ids and
  canonical labels) are the published ones; a concept keeps its published row when its label,
  aliases, fact count and turns are the published ones; every other row is built as in a full
  build;
- DERIVED_FROM / HAS_CONCEPT / ABOUT_CONCEPT edges are made again from the links, in columns.
"""
from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from memlib import schema
from memlib.extract.base import ExtractResult
from memlib.extract.concepts import cluster, token_key
from memlib.extract.facts import fact_row
from memlib.extract.prior import Prior, assemble, edge_frame, merged_edges, positions, take_rows
from memlib.extract.rows import ConceptAttributes, NodeRow, concept_id
from memlib.extract.tables import node_table
from memlib.schema import EdgeKind, NodeKind

_CONCEPT_ATTRS = pl.Struct({"label": pl.String, "aliases": pl.List(pl.String), "n_facts": pl.Int64})
_FACT_ATTRS = pl.Struct({"concepts": pl.List(pl.String), "concept_ids": pl.List(pl.String)})


def _canon(labels: pl.DataFrame, tenant: str, threshold: float, published: pl.DataFrame,
           extends: bool) -> pl.DataFrame:
    """Per distinct label (``labels``: label, count): its cluster's concept id and canonical label.
    ``published``: the published concepts (node_id, label, aliases); when ``extends``, their
    aliases are clusters already known."""
    names = labels["label"].to_list()
    keys = {name: token_key(name) for name in names}
    groups = None
    if extends:
        groups = [{keys[a] for a in aliases} for aliases in published["aliases"].to_list()]
    cids = dict(zip(published["label"].to_list(), published["node_id"].to_list()))  # a label's id is its key's
    rep = cluster(sorted(set(keys.values())), threshold, groups)
    ranked = (labels.with_columns(pl.Series("rep", [rep[keys[n]] for n in names], dtype=pl.String))
              .sort(["rep", "count", "label"], descending=[False, True, False]))
    best = ranked.group_by("rep", maintain_order=True).agg(pl.col("label").first().alias("canonical"))
    best = best.with_columns(pl.Series("cid", [cids.get(c) or concept_id(tenant, token_key(c))
                                               for c in best["canonical"].to_list()], dtype=pl.String))
    return ranked.join(best, on="rep", how="left").select("label", "cid", "canonical")


def finish_reusing(drafts: pa.Table, threshold: float, prior: Prior) -> tuple[ExtractResult, int]:
    """:func:`memlib.extract.facts.finish_drafts` of one tenant's drafts, reusing ``prior``, and
    how many of its nodes are published rows copied."""
    drafts = schema.conform(drafts, schema.FACT_DRAFTS, name="fact_drafts")
    if drafts.num_rows == 0:
        return ExtractResult(schema.empty(schema.NODES_NO_EMBEDDING), schema.empty(schema.EDGES)), 0
    tenants = set(drafts.column("tenant_id").unique().to_pylist())
    if len(tenants) != 1:
        raise ValueError(f"facts: a reused build is of one tenant, got {sorted(tenants)}")
    tenant = tenants.pop()
    df = pl.from_arrow(drafts.select(["node_id", "turn_node_id", "labels"])).with_row_index("f")
    occ = df.select("f", "node_id", "turn_node_id", "labels").explode("labels").drop_nulls("labels")
    counts = occ.group_by("labels").len("count").rename({"labels": "label"})
    concepts = prior.of_kind(NodeKind.CONCEPT)
    attrs = pl.from_arrow(concepts.select(["node_id", "text", "provenance", "attributes"])).with_columns(
        pl.col("attributes").str.json_decode(_CONCEPT_ATTRS).alias("a")).unnest("a")
    extends = prior.extends and set(attrs["aliases"].explode().drop_nulls().to_list()) <= set(counts["label"].to_list())
    canon = _canon(counts, tenant, threshold, attrs, extends)
    links = (occ.rename({"labels": "label"}).join(canon, on="label", how="left", maintain_order="left")
             .unique(subset=["f", "cid"], keep="first", maintain_order=True))
    # a label an alias of a published concept was linked to it: its published id and label
    was = (attrs.select(pl.col("aliases").alias("label"), pl.col("node_id").alias("was_cid"),
                        pl.col("label").alias("was_canonical")).explode("label").drop_nulls("label")
           .unique(subset=["label"], keep="first"))
    moved = canon.join(was, on="label", how="left").filter(
        ~(pl.col("cid").eq_missing(pl.col("was_cid")) & pl.col("canonical").eq_missing(pl.col("was_canonical"))))
    touched = occ.filter(pl.col("labels").is_in(moved["label"].implode()))["f"].unique().to_numpy()
    facts, copied_facts = _facts(drafts, df, links, prior, touched)
    built, copied_concepts = _concepts(links, attrs, concepts, tenant)
    edges = merged_edges([
        edge_frame(tenant, (pl.col("node_id"), pl.col("turn_node_id")), EdgeKind.DERIVED_FROM,
                   pl.concat_list("turn_node_id"), df),
        edge_frame(tenant, (pl.col("turn_node_id"), pl.col("cid")), EdgeKind.HAS_CONCEPT,
                   pl.concat_list("turn_node_id"), links),
        edge_frame(tenant, (pl.col("node_id"), pl.col("cid")), EdgeKind.ABOUT_CONCEPT,
                   pl.concat_list("turn_node_id"), links),
    ])
    return ExtractResult(pa.concat_tables([facts, built]), edges), copied_facts + copied_concepts


def _facts(drafts: pa.Table, df: pl.DataFrame, links: pl.DataFrame, prior: Prior,
           touched: np.ndarray) -> tuple[pa.Table, int]:
    """Every draft's fact row, in draft order: the published one when its session is unchanged and
    its concepts are the published ones, else built. ``touched``: the drafts with a label whose
    concept may not be the published one (the others link the same labels to the same concepts
    as published); only their published concepts are read back."""
    per_fact = links.group_by("f").agg(pl.col("cid").alias("ids"), pl.col("canonical").alias("names"))
    now = df.select("f").join(per_fact, on="f", how="left").sort("f").with_columns(
        pl.col("ids").fill_null(pl.lit([], dtype=pl.List(pl.String))),
        pl.col("names").fill_null(pl.lit([], dtype=pl.List(pl.String))))
    published = prior.of_kind(NodeKind.FACT)
    at = positions(drafts.column("node_id"), published.column("node_id"))
    clean = prior.clean(drafts.column("conversation_id"), drafts.column("session_id")) & (at >= 0)
    check = np.zeros(drafts.num_rows, dtype=bool)
    check[touched] = True
    copy = clean & ~check
    cand = np.flatnonzero(clean & check)
    if cand.size:
        was = pl.from_arrow(take_rows(published, at[cand]).select(["attributes"])).select(
            pl.col("attributes").str.json_decode(_FACT_ATTRS).alias("a")).unnest("a")
        mine = now[cand.tolist()]
        same = (was["concept_ids"] == mine["ids"]) & (was["concepts"] == mine["names"])
        copy[cand[same.fill_null(False).to_numpy()]] = True
    redo = np.flatnonzero(~copy)
    rows = take_rows(drafts, redo).to_pylist()
    mine = now[redo.tolist()]
    built = [fact_row(r, list(zip(ids, names)))
             for r, ids, names in zip(rows, mine["ids"].to_list(), mine["names"].to_list())]
    copied = np.flatnonzero(copy)
    return assemble(take_rows(published, at[copied]), copied, node_table(built), redo), int(copied.size)


def _concepts(links: pl.DataFrame, attrs: pl.DataFrame, published: pa.Table, tenant: str) -> tuple[pa.Table, int]:
    """Every concept row, in first-link order: the published one when its label, aliases, fact
    count and turns are as published, else built."""
    groups = links.group_by("cid", maintain_order=True).agg(
        pl.col("canonical").first(), pl.col("turn_node_id").unique().sort().alias("turns"),
        pl.col("label").unique().sort().alias("aliases"), pl.col("node_id").n_unique().alias("n_facts"))
    was = attrs.select(pl.col("node_id").alias("cid"), pl.col("label").alias("was_label"),
                       pl.col("aliases").alias("was_aliases"), pl.col("n_facts").alias("was_n"),
                       pl.col("provenance").alias("was_turns"), pl.int_range(pl.len()).alias("row"))
    both = groups.join(was, on="cid", how="left", maintain_order="left")
    same = ((both["was_label"] == both["canonical"]) & (both["was_aliases"] == both["aliases"])
            & (both["was_n"] == both["n_facts"]) & (both["was_turns"] == both["turns"])).fill_null(False).to_numpy()
    copied = np.flatnonzero(same)
    redo = np.flatnonzero(~same)
    built = [NodeRow(NodeKind.CONCEPT, r["cid"], tenant, r["canonical"].replace("_", " "), r["turns"],
                     ConceptAttributes(label=r["canonical"], aliases=r["aliases"], n_facts=r["n_facts"])).row()
             for r in both[redo.tolist()].iter_rows(named=True)]
    rows = both["row"].to_numpy()[copied].astype(np.int64) if copied.size else np.zeros(0, np.int64)
    return assemble(take_rows(published, rows), copied, node_table(built), redo), int(copied.size)
