import json

import polars as pl

from memlib.compose.steps import run_extractions
from memlib.extract.base import get_extractor


def test_triplets_carry_turn_provenance(ctx):
    res = get_extractor("triplets", "heuristic").run(ctx)
    nodes = pl.from_arrow(res.nodes)
    trip = nodes.filter(pl.col("kind") == "triplet")
    assert trip.height > 0
    assert (trip["provenance"].list.len() == 1).all()
    assert set(trip["provenance"].list.first()) <= set(ctx.kept_turn_ids)
    assert trip["text"].str.contains("Caroline").any()
    edges = pl.from_arrow(res.edges)
    derived = edges.filter(pl.col("kind") == "DERIVED_FROM")
    assert set(trip["node_id"]) == set(derived["src"])


def test_entities_have_cited_descriptions(ctx, turns):
    res = get_extractor("triplets", "heuristic").run(ctx)
    ents = pl.from_arrow(res.nodes).filter(pl.col("kind") == "entity")
    by_name = {json.loads(a)["name"]: json.loads(a) for a in ents["attributes"]}
    assert "Boston" in by_name and "Caroline" in by_name
    boston = by_name["Boston"]
    assert "[D1:3]" in boston["description"] and boston["turn_ids"] == ["D1:3"]
    edges = pl.from_arrow(res.edges)
    mentions = edges.filter(pl.col("kind") == "MENTIONS")
    assert mentions.height > 0


def test_relation_edges_between_entities(ctx):
    res = get_extractor("triplets", "heuristic").run(ctx)
    rel = pl.from_arrow(res.edges).filter(pl.col("kind") == "RELATION")
    assert rel.height >= 1
    assert rel["relation"].is_not_null().all() and (rel["provenance"].list.len() >= 1).all()


def test_reflections_link_to_facts(ctx):
    res = run_extractions(ctx)
    nodes = pl.from_arrow(res.nodes)
    refl = nodes.filter(pl.col("kind") == "reflection")
    assert refl.height >= 1
    text = refl.filter(pl.col("text").str.contains("pottery class"))["text"][0]
    assert text.startswith("Caroline repeatedly talks about pottery class (")
    edges = pl.from_arrow(res.edges).filter(pl.col("kind") == "DERIVED_FROM_FACT")
    facts = set(nodes.filter(pl.col("kind") == "fact")["node_id"])
    assert edges.height >= 3 and set(edges["dst"]) <= facts
    assert set(refl["provenance"].explode()) <= set(ctx.kept_turn_ids)


def test_events_for_dated_facts(ctx):
    res = run_extractions(ctx)
    ev = pl.from_arrow(res.nodes).filter(pl.col("kind") == "event")
    assert ev.height >= 1
    assert ev.filter(pl.col("text").str.contains("7 May 2023"))["time"][0].date().isoformat() == "2023-05-07"
