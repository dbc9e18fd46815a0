import json

import polars as pl
import pyarrow.compute as pc

from memlib import schema
from memlib.compose.steps import run_extractions
from memlib.extract.base import ExtractionContext, get_extractor


def _nodes(res, kind):
    return pl.from_arrow(res.nodes).filter(pl.col("kind") == kind)


def test_yesterday_fact_dated_and_first_person_replaced(ctx):
    res = get_extractor("facts", "heuristic").run(ctx)
    facts = _nodes(res, "fact")
    hit = facts.filter(pl.col("text").str.contains("pottery class with Melanie"))
    assert hit.height == 1
    row = hit.row(0, named=True)
    assert row["time"].date().isoformat() == "2023-05-07"
    assert "7 May 2023" in row["text"] and row["text"].startswith("On 7 May 2023 Caroline went")
    assert "Caroline's pottery class" in row["text"]
    assert not facts["text"].str.contains(r"\b(?:I|my|me)\b").any()
    assert json.loads(row["attributes"])["speaker"] == "Caroline"


def test_questions_and_phatic_dropped(ctx, turns):
    facts = _nodes(get_extractor("facts", "heuristic").run(
        ExtractionContext(turns=turns, config=ctx.config)), "fact")
    assert not facts["text"].str.contains(r"\?").any()
    assert not facts["text"].str.contains("Thanks").any()


def test_every_fact_derived_from_existing_turn(ctx, turns):
    res = get_extractor("facts", "heuristic").run(ctx)
    edges = pl.from_arrow(res.edges)
    facts = _nodes(res, "fact")
    derived = edges.filter(pl.col("kind") == "DERIVED_FROM")
    assert set(facts["node_id"]) == set(derived["src"])
    assert set(derived["dst"]) <= set(ctx.kept_turn_ids)
    assert set(derived["dst"]) <= set(turns.column("node_id").to_pylist())


def test_concepts_merge_and_exclude_names_and_dates(ctx):
    res = get_extractor("facts", "heuristic").run(ctx)
    concepts = _nodes(res, "concept")
    pottery = concepts.filter(pl.col("text") == "pottery class")
    assert pottery.height == 1
    aliases = json.loads(pottery["attributes"][0])["aliases"]
    assert set(aliases) >= {"pottery_class"}
    edges = pl.from_arrow(res.edges)
    assert edges.filter((pl.col("kind") == "ABOUT_CONCEPT") & (pl.col("dst") == pottery["node_id"][0])).height >= 3
    for text in concepts["text"]:
        assert 2 <= len(text.split()) <= 5
        assert not any(w in text for w in ("caroline", "melanie", "jonas", "may", "2022", "2023", "yesterday"))


def test_run_all_conforms_and_is_stable(ctx, turns, kept_ids):
    a = run_extractions(ctx)
    b = run_extractions(ExtractionContext(turns=turns, kept_turn_ids=kept_ids, config=ctx.config))
    schema.check(a.nodes, schema.NODES_NO_EMBEDDING)
    schema.check(a.edges, schema.EDGES)
    assert a.nodes.column("node_id").to_pylist() == b.nodes.column("node_id").to_pylist()
    assert pc.count_distinct(a.nodes.column("node_id")).as_py() == a.nodes.num_rows
    ids = set(a.nodes.column("node_id").to_pylist()) | set(turns.column("node_id").to_pylist())
    edges = pl.from_arrow(a.edges)
    assert set(edges["src"]) <= ids and set(edges["dst"]) <= ids


def test_extraction_reads_the_configured_roles_only(turns, kept_ids):
    """gate.extract_roles: an assistant's reply is not mined for facts by default (it stays a turn);
    listing the role mines it too."""
    import pyarrow as pa

    from memlib.config import load_config

    roles = ["assistant" if r["speaker"] == "Melanie" else "user" for r in turns.to_pylist()]
    turns = turns.set_column(turns.schema.get_field_index("role"), "role", pa.array(roles, pa.string()))
    melanie = {r["node_id"] for r in turns.to_pylist() if r["speaker"] == "Melanie"}

    default = ExtractionContext(turns=turns, kept_turn_ids=kept_ids, config=load_config(environ={}))
    assert not melanie & set(default.kept_turns().column("node_id").to_pylist())
    facts = get_extractor("facts", "heuristic").run(default).nodes
    sources = {p for ps in facts.column("provenance").to_pylist() for p in ps}
    assert sources and not sources & melanie  # Caroline's facts only
    assert not any("Paris" in t for t in facts.column("text").to_pylist())

    every = load_config(overrides=["gate.extract_roles=[user,assistant,other]"], environ={})
    facts = get_extractor("facts", "heuristic").run(ExtractionContext(turns=turns, kept_turn_ids=kept_ids,
                                                                      config=every)).nodes
    assert any("Paris" in t for t in facts.column("text").to_pylist())
