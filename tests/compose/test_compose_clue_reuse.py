"""Clues and links of a run that added or removed sessions of a published tenant (two LoCoMo
conversations in one tenant): a copy of a session appended (its clue joins the original's, its
turns become the original turns' nearest neighbours), a copy inserted before every session (it
becomes the merged clue's first member), a removed conversation. Each equals a full build."""
from __future__ import annotations

import datetime as dt
import json

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from memlib import ids, schema
from memlib.compose.published_parts import PublishedParts
from memlib.compose.reuse import PreviousTenant


@pytest.fixture(scope="module")
def tenant(locomo_path):
    from memlib.compose.recipe import DEFAULT_RECIPE, get_recipe
    from memlib.compose.reference import StepTools, TenantSessions, embed_turns, tenant_steps
    from memlib.compose.sessions import SessionOutput, session_keys, session_local, split_sessions
    from memlib.compose.vectors import TurnEncoder, TurnVectors, blends, own_pass
    from memlib.config import MemlibConfig
    from memlib.io.readers import read_input

    cfg = MemlibConfig()
    turns = read_input(str(locomo_path), "locomo").turns
    first, second = turns.column("tenant_id").unique().to_pylist()[:2]
    a = split_sessions(turns.filter(pc.equal(turns.column("tenant_id"), first)))[:4]
    b = split_sessions(_renamed(turns.filter(pc.equal(turns.column("tenant_id"), second)), tenant_id=first))[:3]
    encoder = TurnEncoder(cfg, threads=2)
    plan = get_recipe(DEFAULT_RECIPE)
    state = {"nlp": None}

    def local(s):
        key = session_keys(s, "k")[0].as_py()
        tv = embed_turns(s, None, cfg, encoder)
        out, state["nlp"] = session_local((s, tv.vectors, key), cfg, plan, state["nlp"])
        return s, out, tv, key

    sessions = {f"a{i}": local(s) for i, s in enumerate(a)} | {f"b{i}": local(s) for i, s in enumerate(b)}
    last = max(t for s, *_ in sessions.values() for t in s.column("session_time").to_pylist())
    early = min(t for s, *_ in sessions.values() for t in s.column("session_time").to_pylist())
    sessions["a1_last"] = local(_copy(sessions["a1"][0], last + dt.timedelta(days=1), 99))
    sessions["a2_first"] = local(_copy(sessions["a2"][0], early - dt.timedelta(days=1), -1))
    tools = StepTools(state["nlp"], {}, own_pass(cfg, encoder if blends(cfg) else encoder.passages))

    def build(names, previous=None):
        chosen = [sessions[n] for n in names]
        return tenant_steps(TenantSessions(pa.concat_tables([s for s, *_ in chosen]),
                                           SessionOutput.concat([o for _, o, _, _ in chosen]),
                                           TurnVectors.concat([v for *_, v, _ in chosen], cfg.embed.dim),
                                           [k for *_, k in chosen], previous), cfg, plan, tools)

    return build


def _renamed(turns: pa.Table, **columns) -> pa.Table:
    df = pl.from_arrow(turns).with_columns(**{k: pl.lit(v) for k, v in columns.items()})
    df = df.with_columns(pl.Series("node_id", [ids.turn_node_id(t, c, u) for t, c, u in
                                               df.select("tenant_id", "conversation_id", "turn_id").iter_rows()]))
    return schema.conform(df.to_arrow(), turns.schema)


def _copy(session: pa.Table, when: dt.datetime, index: int) -> pa.Table:
    """The same turns as another session, ``when``, as session ``index`` of its conversation."""
    df = pl.from_arrow(session).with_columns(pl.col("session_id") + "-again", pl.col("turn_id") + "-again",
                                             pl.lit(when).cast(pl.from_arrow(session)["session_time"].dtype)
                                             .alias("session_time"),
                                             pl.lit(index, dtype=pl.Int32).alias("session_index"))
    return _renamed(schema.conform(df.to_arrow(), session.schema))


BASE = ["a0", "a1", "a2", "a3", "b0", "b1", "b2"]


def _published(out) -> PreviousTenant:
    return PreviousTenant.of(out.nodes, PublishedParts.of(out.edges, out.fallbacks, out.token_sums))


def _same(got, full) -> None:
    assert got.nodes.equals(full.nodes)
    assert got.edges.equals(full.edges)


def _clue_of(out, session_id: str) -> dict:
    """The (merged) clue of ``session_id``."""
    turns = out.nodes.filter(pc.and_(pc.equal(out.nodes.column("kind"), "turn"),
                                     pc.equal(out.nodes.column("session_id"), session_id)))
    node = ids.session_node_id(out.tenant_id, turns.column("conversation_id")[0].as_py(), session_id)
    clues = out.nodes.filter(pc.equal(out.nodes.column("kind"), "clue")).to_pylist()
    return next(c for c in clues if node in json.loads(c["attributes"])["session_node_ids"])


def _similar(out) -> set[tuple[str, str]]:
    e = out.edges.filter(pc.equal(out.edges.column("kind"), "SIMILAR"))
    return set(zip(e.column("src").to_pylist(), e.column("dst").to_pylist()))


def test_a_copied_session_appended_joins_the_clue_and_the_nearest_neighbours(tenant):
    published = tenant(BASE)
    now = BASE + ["a1_last"]
    got, full = tenant(now, _published(published)), tenant(now)
    _same(got, full)
    assert got.reused["appended_only"] == 1
    merged = json.loads(_clue_of(got, "session_2-again")["attributes"])
    assert len(merged["merged_from"]) == 2  # the copy's clue joined the original's
    old = set(published.nodes.filter(pc.equal(published.nodes.column("kind"), "turn")).column("node_id").to_pylist())
    new_pairs = _similar(got) - _similar(published)
    assert any((a in old) != (b in old) for a, b in new_pairs)  # an added turn is an old turn's neighbour now


def test_a_copy_before_every_session_becomes_the_merged_clues_first_member(tenant):
    published = tenant(BASE)
    now = ["a2_first"] + BASE
    got, full = tenant(now, _published(published)), tenant(now)
    _same(got, full)
    clue = _clue_of(got, "session_3-again")
    turns = got.nodes.filter(pc.equal(got.nodes.column("kind"), "turn"))
    first_time = min(t for t in turns.column("time").to_pylist() if t is not None)
    assert clue["time"] == first_time and len(json.loads(clue["attributes"])["merged_from"]) == 2


def test_a_removed_conversation_equals_a_full_build(tenant):
    published = tenant(BASE + ["a1_last"])
    now = ["a0", "a1", "a2", "a3"]
    got, full = tenant(now, _published(published)), tenant(now)
    _same(got, full)
    assert got.reused["removed_turns"] > 0


def test_an_added_turn_that_becomes_an_old_turns_nearest_neighbour_replaces_its_farthest():
    """Old turn 0 had its top_k neighbours 1..3; an added turn closer than all of them enters its
    top_k and pushes out 3 (the edge 0-3 survives only if 3 keeps it in its own top_k): the
    changed-pairs edges equal the full edges, and differ from the earlier ones on exactly that."""
    import numpy as np

    from memlib.text.similar import EarlierEdges, similar_edges, similar_edges_changed

    rng = np.random.default_rng(0)
    base = rng.normal(size=16)
    old = np.stack([base] + [base + s * rng.normal(size=16) for s in (0.3, 0.35, 0.4)]
                   + [rng.normal(size=16) for _ in range(6)]).astype(np.float32)
    new = (base + 0.05 * rng.normal(size=16)).astype(np.float32)[None]
    ids_old = [f"turn:{i}" for i in range(len(old))]
    before = similar_edges(ids_old, ["t"] * len(old), old, 0.5, top_k=3)
    now = np.concatenate([old, new])
    ids_now = ids_old + ["turn:new"]
    full = similar_edges(ids_now, ["t"] * len(now), now, 0.5, top_k=3)
    got = similar_edges_changed(ids_now, "t", now, 0.5, EarlierEdges(before.select(["src", "dst", "weight"]),
                                                                    np.array([len(old)])), top_k=3)
    assert got.sort_by([("src", "ascending"), ("dst", "ascending")]).equals(
        full.sort_by([("src", "ascending"), ("dst", "ascending")]))
    pairs = lambda t: set(zip(t.column("src").to_pylist(), t.column("dst").to_pylist()))  # noqa: E731
    assert ("turn:0", "turn:new") in pairs(got)
    assert pairs(before) - pairs(got)  # an earlier neighbour left some old turn's top_k
