"""The facts and triplets steps of a run that only added or removed turns (memlib.compose.extract_reuse):
published rows copied where their inputs did not change, the output equal to a full build's."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from memlib.compose.published_parts import PublishedParts
from memlib.compose.reuse import PreviousTenant


@pytest.fixture(scope="module")
def conversation(locomo_path):
    """One LoCoMo conversation through the session-local steps once; ``build`` runs the tenant
    steps over some of its sessions (by index), as a build of those sessions would."""
    from memlib.compose.recipe import DEFAULT_RECIPE, get_recipe
    from memlib.compose.reference import StepTools, TenantSessions, embed_turns, tenant_steps
    from memlib.compose.sessions import SessionOutput, session_keys, session_local, split_sessions
    from memlib.compose.vectors import TurnEncoder, TurnVectors, blends, own_pass
    from memlib.config import MemlibConfig
    from memlib.io.readers import read_input

    cfg = MemlibConfig()
    turns = read_input(str(locomo_path), "locomo").turns
    turns = turns.filter(pc.equal(turns.column("tenant_id"), turns.column("tenant_id")[0]))
    encoder = TurnEncoder(cfg, threads=2)
    plan = get_recipe(DEFAULT_RECIPE)
    sessions, nlp = [], None
    for s in split_sessions(turns):
        key = session_keys(s, "k")[0].as_py()
        tv = embed_turns(s, None, cfg, encoder)
        out, nlp = session_local((s, tv.vectors, key), cfg, plan, nlp)
        sessions.append((s, out, tv, key))
    tools = StepTools(nlp, {}, own_pass(cfg, encoder if blends(cfg) else encoder.passages))

    built = {}

    def build(which, previous=None, edit=None):
        if previous is None and edit is None and tuple(which) in built:
            return built[tuple(which)]
        chosen = [sessions[i] for i in which]
        if edit is not None:
            chosen = [edit(*x) if i == which[-1] else x for i, x in zip(which, chosen)]
        part = pa.concat_tables([s for s, _, _, _ in chosen])
        out = tenant_steps(TenantSessions(part, SessionOutput.concat([o for _, o, _, _ in chosen]),
                                          TurnVectors.concat([v for _, _, v, _ in chosen], cfg.embed.dim),
                                          [k for _, _, _, k in chosen], previous), cfg, plan, tools)
        if previous is None and edit is None:
            built[tuple(which)] = out
        return out

    return {"n": len(sessions), "build": build, "sessions": sessions, "cfg": cfg, "plan": plan, "nlp": nlp}


def _published(out) -> PreviousTenant:
    return PreviousTenant.of(out.nodes, PublishedParts.of(out.edges, out.fallbacks, out.token_sums))


def _assert_same(got, full) -> None:
    assert got.nodes.equals(full.nodes)
    assert got.edges.equals(full.edges)


@pytest.mark.parametrize("case", ["last", "middle", "first"])
def test_an_added_session_copies_rows_and_equals_a_full_build(conversation, case):
    """A new session (last, in the middle of the order, first): the published concept clusters are
    extended with the new labels only; the output equals a full build's."""
    n, build = conversation["n"], conversation["build"]
    gone = {"last": n - 1, "middle": n // 2, "first": 0}[case]
    before = build([i for i in range(n) if i != gone])
    full = build(list(range(n)))
    got = build(list(range(n)), _published(before))
    _assert_same(got, full)
    assert got.reused["appended_only"] == 1
    facts = full.counts()["nodes_by_kind"]
    assert got.reused["facts_rows_copied"] > (facts["fact"] + facts["concept"]) // 2
    assert got.reused["triplets_rows_copied"] > (facts["triplet"] + facts["entity"]) // 2


@pytest.mark.parametrize("gone", [0, 3])
def test_a_removed_session_copies_rows_and_equals_a_full_build(conversation, gone):
    """A removed session: every label is clustered again (a removed label can split a cluster),
    unchanged rows are still copied; the output equals a full build's."""
    n, build = conversation["n"], conversation["build"]
    published = _published(build(list(range(n))))
    now = [i for i in range(n) if i != gone]
    got = build(now, published)
    _assert_same(got, build(now))
    assert got.reused["removed_turns"] > 0 and got.reused["facts_rows_copied"] > 0


def test_a_session_replaced_by_another_equals_a_full_build(conversation):
    n, build = conversation["n"], conversation["build"]
    published = _published(build(list(range(n - 1))))
    now = list(range(1, n))
    got = build(now, published)
    _assert_same(got, build(now))
    assert got.reused["facts_rows_copied"] > 0


def test_an_edited_turn_runs_the_steps_in_full(conversation):
    """A published turn whose text changed: nothing is copied; the output equals a full build's."""
    from memlib.compose.sessions import session_local

    n, build, cfg, plan = conversation["n"], conversation["build"], conversation["cfg"], conversation["plan"]
    published = _published(build(list(range(n))))

    def edit(s, out, tv, key):
        text = s.column("text").to_pylist()
        text[0] = text[0] + " We moved to Porto."
        s = s.set_column(s.column_names.index("text"), s.schema.field("text"), pa.array(text, pa.string()))
        out, _ = session_local((s, tv.vectors, key + "e"), cfg, plan, conversation["nlp"])
        return s, out, tv, key + "e"

    got = build(list(range(n)), published, edit=edit)
    assert "facts_rows_copied" not in got.reused
    _assert_same(got, build(list(range(n)), edit=edit))


def test_a_session_whose_date_changed_is_rebuilt_and_equals_a_full_build(conversation):
    """Same turn texts (so the run is still an append), another session date: its drafts' times and
    resolved dates change, so the session is dirty and its rows are built again."""
    import datetime as dt

    from memlib.compose.sessions import session_local

    n, build, cfg, plan = conversation["n"], conversation["build"], conversation["cfg"], conversation["plan"]
    published = _published(build(list(range(n))))

    def redate(s, out, tv, key):
        col = s.column_names.index("session_time")
        times = [t + dt.timedelta(days=3) if t is not None else None for t in s.column("session_time").to_pylist()]
        s = s.set_column(col, s.schema.field("session_time"), pa.array(times, s.schema.field("session_time").type))
        out, _ = session_local((s, tv.vectors, key + "d"), cfg, plan, conversation["nlp"])
        return s, out, tv, key + "d"

    got = build(list(range(n)), published, edit=redate)
    assert got.reused["appended_only"] == 1 and got.reused["facts_rows_copied"] > 0
    full = build(list(range(n)), edit=redate)
    _assert_same(got, full)
    before = build(list(range(n)))
    facts = lambda out: out.nodes.filter(pc.equal(out.nodes.column("kind"), "fact")).drop_columns(["embedding"])  # noqa: E731
    assert not facts(full).equals(facts(before))  # the date reached the facts (times, dates)
