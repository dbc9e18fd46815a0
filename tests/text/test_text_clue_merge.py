"""The columnar clue merge (memlib.text.clue_merge) against the row-by-row merge it replaced:
a clue joining a group, one that changes a group's first member (its time, text and attributes),
one bridging two groups, a group losing a member, and random tenants."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from memlib import ids, schema
from memlib.text.clue_merge import clue_text, merge_clues, merged_vectors
from memlib.text.similar import normalize_rows, pairs_above

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def _reference(clue_nodes: pa.Table, vectors: np.ndarray, threshold: float, edges: pa.Table):
    """The merge as it was written before (every clue a Python row, edges rewritten row by row)."""
    v = normalize_rows(vectors)
    tenants = np.asarray(clue_nodes.column("tenant_id").to_pylist(), dtype=object)
    ii, jj = [np.zeros(0, int)], [np.zeros(0, int)]
    for tenant in dict.fromkeys(tenants.tolist()):
        members = np.flatnonzero(tenants == tenant)
        i, j, _ = pairs_above(v[members], threshold, None)
        ii.append(members[i])
        jj.append(members[j])
    i, j = np.concatenate(ii), np.concatenate(jj)
    labels = connected_components(coo_matrix((np.ones(len(i)), (i, j)), shape=(len(v), len(v))), directed=False)[1]
    rows = clue_nodes.to_pylist()
    groups: dict[int, list[int]] = {}
    for r, lab in enumerate(labels.tolist()):
        groups.setdefault(lab, []).append(r)
    merged, id_map = [], {}
    for members in groups.values():
        member_rows = sorted((rows[m] for m in members), key=lambda r: (r["time"] is None, r["time"], r["node_id"]))
        old = [r["node_id"] for r in member_rows]
        new_id = old[0] if len(old) == 1 else ids.make_id("clue", member_rows[0]["tenant_id"], *sorted(old))
        id_map.update({o: new_id for o in old})
        attrs = [json.loads(r["attributes"] or "{}") for r in member_rows]
        phrases = list(dict.fromkeys(p for a in attrs for p in a.get("keyphrases", [])))
        speakers = list(dict.fromkeys(s for a in attrs for s in a.get("speakers", [])))
        sessions = list(dict.fromkeys(s for a in attrs for s in a.get("session_node_ids", [])))
        times = [r["time"] for r in member_rows if r["time"] is not None]
        one = len(member_rows) == 1
        merged.append({**member_rows[0], "node_id": new_id,
                       "conversation_id": member_rows[0]["conversation_id"]
                       if len({r["conversation_id"] for r in member_rows}) == 1 else None,
                       "session_id": member_rows[0]["session_id"] if one else None,
                       "text": member_rows[0]["text"] if one else clue_text(speakers, phrases),
                       "time": min(times) if times else None, "valid_from": min(times) if times else None,
                       "provenance": list(dict.fromkeys(t for r in member_rows for t in (r["provenance"] or []))),
                       "attributes": member_rows[0]["attributes"] if one else json.dumps(
                           {"keyphrases": phrases, "speakers": speakers, "session_node_ids": sessions,
                            "merged_from": old})})
    nodes = schema.conform(pa.Table.from_pylist(merged, schema=clue_nodes.schema), schema.NODES_NO_EMBEDDING)
    e = edges.to_pylist()
    seen, out = set(), []
    for row in e:
        row = {**row, "src": id_map.get(row["src"], row["src"]), "dst": id_map.get(row["dst"], row["dst"])}
        key = (row["tenant_id"], row["src"], row["dst"], row["kind"])
        if key not in seen:
            seen.add(key)
            out.append(row)
    return nodes, schema.conform(pa.Table.from_pylist(out, schema=edges.schema), schema.EDGES), id_map


def _clues(spec: list[tuple[str, str, int, list[str]]]) -> tuple[pa.Table, pa.Table]:
    """Clue nodes and their HAS_CLUE edges (session and one segment per clue) from (tenant, session,
    day, phrases) rows, as memlib.text.clues writes them."""
    nodes, edges = [], []
    for tenant, session, day, phrases in spec:
        nid, sid = ids.make_id("clue", tenant, "c", session), ids.session_node_id(tenant, "c", session)
        turns = [f"turn:{session}:{k}" for k in range(3)]
        nodes.append({"node_id": nid, "tenant_id": tenant, "conversation_id": "c", "kind": "clue",
                      "text": clue_text(["Ana"], phrases), "time": T0 + timedelta(days=day),
                      "valid_from": T0 + timedelta(days=day), "session_id": session, "belief": 1.0,
                      "source": "heuristic", "provenance": turns,
                      "attributes": json.dumps({"keyphrases": phrases, "speakers": ["Ana"],
                                                "session_node_ids": [sid]})})
        for src in (sid, f"segment:{session}", "segment:shared"):  # a shared source: duplicates once merged
            edges.append({"tenant_id": tenant, "src": src, "dst": nid, "kind": "HAS_CLUE", "weight": 1.0,
                          "provenance": turns})
    table = schema.conform(pa.Table.from_pylist(nodes), schema.NODES_NO_EMBEDDING)
    return table, schema.conform(pa.Table.from_pylist(edges), schema.EDGES)


def _unit(*axes: float, dim: int = 8) -> np.ndarray:
    v = np.zeros(dim, dtype=np.float32)
    v[:len(axes)] = axes
    return v / np.linalg.norm(v)


def _check(spec, vectors, threshold=0.9):
    nodes, edges = _clues(spec)
    got = merge_clues(nodes, np.stack(vectors), threshold, edges=edges)
    want = _reference(nodes, np.stack(vectors), threshold, edges)
    assert got[0].equals(want[0])
    assert got[1].equals(want[1])
    assert got[2] == want[2]
    old = nodes.column("node_id").to_pylist()
    new = got[0].column("node_id").to_pylist()
    assert np.array_equal(merged_vectors(got[2], old, np.stack(vectors), new),
                          merged_vectors(want[2], old, np.stack(vectors), new))
    return got


BEFORE = [("t", "S1", 1, ["pottery class"]), ("t", "S2", 2, ["pottery kiln"]), ("t", "S3", 3, ["bakery job"]),
          ("t", "S4", 4, ["sailing"])]
VECTORS = [_unit(1, 0.01), _unit(1, 0.02), _unit(0, 1), _unit(0, 0, 1)]


def test_a_clue_joining_a_group_merges_as_the_row_by_row_merge():
    got = _check(BEFORE + [("t", "S5", 5, ["pottery wheel"])], VECTORS + [_unit(1, 0.03)])
    assert got[0].num_rows == 3
    row = got[0].to_pylist()[0]
    members = [ids.make_id("clue", "t", "c", s) for s in ("S1", "S2", "S5")]
    assert json.loads(row["attributes"])["merged_from"] == members


def test_a_clue_earlier_than_a_group_becomes_its_first_member():
    """The new clue is the group's earliest: the merged row's time, text (phrases in member order)
    and ``merged_from`` change, as a full merge orders them."""
    got = _check(BEFORE + [("t", "S0", 0, ["clay bowl"])], VECTORS + [_unit(1, 0.03)])
    row = got[0].to_pylist()[0]
    assert row["time"] == T0 and row["text"] == "Ana: clay bowl, pottery class, pottery kiln"


def test_a_clue_bridging_two_groups_makes_one_group():
    spec = BEFORE + [("t", "S6", 6, ["bakery job"]), ("t", "S7", 7, ["kiln bakery"])]
    vectors = VECTORS + [_unit(0.02, 1), _unit(1, 1)]
    without = _check(spec[:-1], vectors[:-1], threshold=0.7)
    got = _check(spec, vectors, threshold=0.7)
    assert (without[0].num_rows, got[0].num_rows) == (3, 2)


def test_a_group_that_lost_a_member_and_clues_alone():
    got = _check(BEFORE[1:], VECTORS[1:])
    assert got[0].num_rows == 3 and got[1].num_rows == 9
    assert got[0].column("node_id").to_pylist() == [ids.make_id("clue", "t", "c", s) for s in ("S2", "S3", "S4")]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_tenants_merge_as_the_row_by_row_merge(seed):
    rng = np.random.default_rng(seed)
    spec = [(f"t{rng.integers(2)}", f"S{i}", int(rng.integers(30)), [f"topic {rng.integers(5)}"]) for i in range(60)]
    centers = rng.normal(size=(6, 16))
    vectors = [(centers[rng.integers(6)] + 0.15 * rng.normal(size=16)).astype(np.float32) for _ in spec]
    got = _check(spec, vectors, threshold=0.95)
    assert 2 < got[0].num_rows < len(spec)


def test_a_clue_alone_is_written_as_the_row_merge_writes_it():
    """A clue alone in its group: valid from its time, its provenance without repeats."""
    nodes, edges = _clues(BEFORE)
    prov = nodes.column("provenance").to_pylist()
    prov[2] = prov[2] + prov[2][:1]  # S3, alone
    nodes = nodes.set_column(nodes.schema.get_field_index("provenance"), "provenance",
                             pa.array(prov, nodes.schema.field("provenance").type))
    nodes = nodes.set_column(nodes.schema.get_field_index("valid_from"), "valid_from",
                             pa.array([None] * nodes.num_rows, nodes.schema.field("valid_from").type))
    got = merge_clues(nodes, np.stack(VECTORS), 0.9, edges=edges)
    want = _reference(nodes, np.stack(VECTORS), 0.9, edges)
    assert got[0].equals(want[0]) and got[0].num_rows == 3
    assert got[0].column("provenance")[1].as_py() == prov[2][:-1]
    assert got[0].column("valid_from")[1] == got[0].column("time")[1]
