"""Turn/session nodes and NEXT / IN_SESSION edges."""
from __future__ import annotations

import json

import polars as pl
import pyarrow as pa

from memlib import ids, schema
from memlib.text.structure import index_text, session_nodes, structure_edges, turn_nodes


def test_text_index_text_caption_and_speaker():
    assert index_text("Ana", " hi there ", None) == "Ana: hi there"
    extras = json.dumps({"blip_caption": "a photo of a dog"})
    assert index_text("Ana", "Look!", extras) == "Ana: Look! [image: a photo of a dog]"
    assert index_text("Ana", "Look!", extras, with_caption=False) == "Ana: Look!"
    assert index_text(None, "Look!", json.dumps({"caption": "x"})) == "Look! [image: x]"
    assert index_text("Ana", "Look!", "not json") == "Ana: Look!"


def test_text_turn_nodes_schema_and_fields(turns):
    nodes = turn_nodes(turns)
    schema.check(nodes, schema.NODES_NO_EMBEDDING)
    assert nodes.column("node_id").to_pylist() == turns.column("node_id").to_pylist()
    row = nodes.to_pylist()[5]
    assert row["kind"] == "turn" and row["provenance"] == [row["node_id"]]
    assert row["text"].endswith("[image: a photo of a clay bowl on a wheel]")
    attrs = json.loads(row["attributes"])
    assert attrs == {"turn_id": "S1:6", "speaker": "Ben", "role": "other", "session_index": 0, "turn_index": 5}


def test_text_next_edges_chain_each_session_in_order(turns):
    shuffled = turns.take(pa.array([13, 3, 0, 9, 7, 1, 12, 5, 2, 10, 4, 8, 6, 11]))
    table = structure_edges(shuffled)
    schema.check(table, schema.EDGES)
    edges = pl.from_arrow(table)
    nxt = edges.filter(pl.col("kind") == "NEXT")
    tdf = pl.from_arrow(turns)
    for _key, grp in tdf.group_by(["tenant_id", "conversation_id", "session_id"]):
        order = grp.sort("turn_index")["node_id"].to_list()
        want = set(zip(order, order[1:]))
        got = {(s, d) for s, d in nxt.filter(pl.col("src").is_in(order)).select("src", "dst").iter_rows()}
        assert got == want
    assert len(nxt) == turns.num_rows - 3  # 3 sessions
    ins = edges.filter(pl.col("kind") == "IN_SESSION")
    assert len(ins) == turns.num_rows
    assert set(ins["dst"].to_list()) == {ids.session_node_id("t1", "c1", "S1"), ids.session_node_id("t1", "c1", "S2"),
                                         ids.session_node_id("t2", "c9", "S1")}


def test_text_session_nodes_provenance_and_fallback(turns):
    nodes = session_nodes(turns)
    schema.check(nodes, schema.NODES_NO_EMBEDDING)
    assert nodes.num_rows == 3
    first = nodes.to_pylist()[0]
    assert first["provenance"] == turns.column("node_id").to_pylist()[:8]
    assert first["text"].startswith("Ana: Hey Ben!")
    segs = pa.Table.from_pylist([{
        "segment_id": "segment:x", "tenant_id": "t1", "conversation_id": "c1", "session_id": "S1",
        "segment_index": 0, "turn_ids": [], "kept_turn_ids": [], "summary": "Ana adopted a dog.",
        "session_time": None}], schema=schema.SEGMENTS)
    with_summary = session_nodes(turns, segs).to_pylist()
    assert with_summary[0]["text"] == "Ana adopted a dog."
    assert with_summary[1]["text"].startswith("Ana: I moved to Denver")


def test_text_structure_ids_stable(turns):
    a = structure_edges(turns), session_nodes(turns), turn_nodes(turns)
    b = structure_edges(turns), session_nodes(turns), turn_nodes(turns)
    for x, y in zip(a, b):
        assert x.equals(y)
