"""``auto``'s memory signals on the sample store: a fact matching the question lifts its
provenance turn, personalized PageRank from the matched memories reaches turns the question does
not name, a relative date in the question picks the session it means, and ``signals`` names each
(memlib/retrieve/memory.py, docs/decisions/0032-auto-reads-memory.md)."""
from __future__ import annotations

import json
from datetime import timedelta

import numpy as np
import pytest

from memlib.retrieve import memory
from memlib.retrieve.kernels import run_search
from memlib.retrieve.registry import get_strategy
from memlib.retrieve.signals import turn_frame
from tests.retrieve.conftest import SAMPLE, retrieve_config

pytestmark = pytest.mark.ray


def _rank(res, node_id: str) -> int:
    ids = [t.node_id for t in res.turns]
    return ids.index(node_id) if node_id in ids else len(ids) + 1


def _auto(**params):
    return get_strategy("auto", retrieve_config(), **params)


def _turns_only():
    """``auto`` without its memory signals: the turn ranking alone."""
    return _auto(memory_weight=0.0, time_weight=0.0)


def _evidence(question_id: str) -> list[str]:
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if '"question"' in line]
    return next(r["evidence"] for r in rows if r.get("question_id") == question_id)


def _facts_with_one_turn(index):
    """(fact row, its one provenance turn) of every fact citing exactly one turn."""
    rows = index.rows_of_kind(["fact"])
    return [(int(r), index.provenance[r][0]) for r in rows if len(index.provenance[r]) == 1
            and index.provenance[r][0] in index.turns]


def test_a_matching_fact_votes_for_its_turn(cache):
    # "Where will Lena work from August 2024?": the turn saying so is far down by its own words;
    # the fact the build extracted from it matches the question and lifts it
    index = cache.get("tomas-lena")
    query = "Where will Lena work from August 2024?"
    plain = run_search(index, _turns_only(), query, 40)
    k, w = 10, 1.0
    # the votes of every turn (the named speaker's gate off: tested below)
    fused = run_search(index, _auto(memory_weight=w, time_weight=0.0, rank_k=k, memory_signals=["fact"],
                                    speaker_gate=False), query, 40)
    evidence = [index.turn_by_source[e] for e in _evidence("tomas-lena:q6")]
    turn = max(evidence, key=lambda t: _rank(plain, t))  # the one its own words rank worst
    assert _rank(fused, turn) < _rank(plain, turn)
    node = next(n for n in fused.nodes if n.node_id == turn)
    assert node.signals["fact_vote"] > 0
    # the fused score: the turn's own score plus w · k / (k + its rank by the vote)
    frame = turn_frame(index)
    mem = memory.memory_frame(index, frame, ("fact",))
    # a wordllama store: the question vector comes from its embedder, not the token vectors
    votes = mem.votes(mem.vectors @ memory.query_vector(index, np.zeros((0, 0)), query), "fact")
    assert node.signals["fact_vote"] == pytest.approx(votes[frame.pos[turn]], abs=1e-5)
    vote_rank = memory.ranks(votes)[frame.pos[turn]]
    own = next(n for n in plain.nodes if n.node_id == turn).score
    assert node.score == pytest.approx(own + w * k / (k + vote_rank), rel=1e-6)
    # every turn some fact cites has a vote; the others none
    cited = np.diff(mem.cite_ptr) > 0
    assert (votes[~cited] == 0).all() and cited.any()


def test_ppr_from_matched_memories_reaches_turns_the_question_does_not_name(cache):
    index = cache.get("maya")
    frame = turn_frame(index)
    mem = memory.memory_frame(index, frame, ("event", "fact"))
    row, turn = _facts_with_one_turn(index)[0]
    j = mem.node_ids.index(index.node_ids[row])
    sims = np.zeros(len(mem.node_ids))
    sims[j] = 1.0  # the question matches this one fact only
    mass = memory.ppr_term(index, frame, mem, sims, seeds=1, seed_kinds=("fact",), max_nodes=20000)
    assert mass is not None and mass.shape == (len(frame.ids),)
    assert mass[frame.pos[turn]] > 0  # its own turn
    others = [frame.ids[p] for p in np.flatnonzero(mass > 0) if frame.ids[p] != turn]
    assert others  # turns reached through the graph (entities, concepts, neighbours), not cited by the fact
    # the same by forward push (a graph above max_nodes: a haystack's), within its tolerance
    pushed = memory.ppr_term(index, frame, mem, sims, seeds=1, seed_kinds=("fact",), max_nodes=50)
    assert pushed is not None and pushed[frame.pos[turn]] > 0
    np.testing.assert_allclose(pushed, mass, atol=1e-3)
    res = run_search(index, _auto(memory_weight=1.0, rank_k=10, memory_signals=["ppr"]), index.texts[row], 10)
    assert all("ppr" in n.signals for n in res.nodes)
    # "Where does Raj work now?": the graph from the matched memories lifts the evidence turn its
    # own words rank worst
    index = cache.get("raj")
    query = "Where does Raj work now?"
    plain = run_search(index, _turns_only(), query, 40)
    fused = run_search(index, _auto(memory_weight=1.0, time_weight=0.0, rank_k=10, memory_signals=["ppr"]), query, 40)
    turn = max((index.turn_by_source[e] for e in _evidence("raj:q3")), key=lambda t: _rank(plain, t))
    assert _rank(fused, turn) < _rank(plain, turn)


def test_a_relative_date_picks_the_session_it_means(cache):
    index = cache.get("maya")
    frame = turn_frame(index)
    sessions = sorted({(info.time, info.session_id) for info in index.turns.values() if info.time is not None})
    assert len(sessions) >= 3
    when, session = sessions[1]
    asked = when + timedelta(days=61)  # "two months ago" from the question's date
    inside, windows = memory.time_term(frame, "What did I do two months ago?", asked)
    assert windows >= 1 and inside is not None
    picked = {index.turns[frame.ids[p]].session_id for p in np.flatnonzero(inside)}
    assert picked == {session}
    strategy = _auto(time_weight=2.0, rank_k=10, memory_signals=["time"])
    res = run_search(index, strategy, "What did I do two months ago?", 5, question_time=asked.isoformat())
    assert res.turns[0].session_id == session
    assert res.nodes[0].signals["time_window"] == 1.0
    # no temporal expression: no term
    assert memory.time_term(frame, "Who looks after Biscuit?", asked) == (None, 0)


def test_memory_off_is_the_turn_ranking(cache):
    index = cache.get("maya")
    query = "Who looks after Biscuit during the Lisbon trip?"
    off = run_search(index, _turns_only(), query, 10)
    assert not any(k in off.nodes[0].signals for k in ("fact_vote", "ppr", "time_window"))
    on = run_search(index, _auto(memory_weight=0.5, rank_k=10, memory_signals=["fact", "ppr"]), query, 10)
    assert {"fact_vote", "ppr", "maxsim", "session_prior"} <= set(on.nodes[0].signals)
    default = run_search(index, _auto(), query, 10)  # the defaults read the memory
    assert {"fact_vote", "ppr"} <= set(default.nodes[0].signals)
    with pytest.raises(ValueError, match="unknown memory signal"):
        run_search(index, _auto(memory_weight=0.5, memory_signals=["facts"]), query, 10)


def test_rrf_ranks_and_positive_only():
    score = np.array([0.5, 2.0, -1.0, 2.0])
    assert memory.ranks(score).tolist() == [3.0, 1.0, 4.0, 2.0]
    term = memory.rrf(score, 10, only_positive=True)
    assert term[2] == 0.0 and term[1] == pytest.approx(1 / 11) and term[3] == pytest.approx(1 / 12)


def test_the_named_speakers_turns_get_the_term_and_the_memory_votes(cache):
    """A question naming a person who speaks in the tenant: that person's turns gain
    ``participant_weight`` standard deviations, and the memory votes go to them only
    (docs/decisions/0037-named-speaker-turns.md)."""
    index = cache.get("tomas-lena")
    frame = turn_frame(index)
    query = "Where will Lena work from August 2024?"
    speaks = frame.named_speakers(query)
    assert speaks.any() and not speaks.all()
    assert set(frame.speaker[speaks]) == {"lena"}
    n = len(frame.ids)
    # the term: with the memory and the session lead off, exactly participant_weight on Lena's turns
    common = dict(memory_weight=0.0, time_weight=0.0, session_lead=0.0, speaker_gate=False)
    on = {r.node_id: r for r in run_search(index, _auto(**common, participant_weight=0.75), query, n).nodes}
    off = {r.node_id: r.score for r in run_search(index, _auto(**common, speaker_term=False,
                                                                participant_weight=0.75), query, n).nodes}
    assert set(on) == set(off) == set(frame.ids)
    for t, node in on.items():
        assert node.signals["named_speaker"] == bool(speaks[frame.pos[t]])
        assert node.score - off[t] == pytest.approx(0.75 if speaks[frame.pos[t]] else 0.0, abs=1e-9)
    # the gate: fact votes and PPR only on Lena's turns, ranked among them; without the gate some
    # of Tomas's turns have votes
    params = dict(memory_weight=1.0, time_weight=0.0, rank_k=10, memory_signals=["fact", "ppr"])
    gated = run_search(index, _auto(**params), query, n).nodes
    open_ = run_search(index, _auto(**params, speaker_gate=False), query, n).nodes
    tomas = [r for r in open_ if not r.signals["named_speaker"]]
    assert any(r.signals["fact_vote"] > 0 or r.signals["ppr"] > 0 for r in tomas)
    for r in gated:
        if not r.signals["named_speaker"]:
            assert r.signals["fact_vote"] == 0.0 and r.signals["ppr"] == 0.0
    assert any(r.signals["fact_vote"] > 0 for r in gated)
    # a question naming nobody who speaks: no term, no gate (the same ranking either way)
    asked = "Which shop sold bikes on opening day?"
    assert not frame.named_speakers(asked).any()
    assert ([r.node_id for r in run_search(index, _auto(), asked, 10).nodes]
            == [r.node_id for r in run_search(index, _auto(speaker_term=False, speaker_gate=False), asked, 10).nodes])


def test_a_question_naming_the_wrong_person_keeps_its_ranking(cache):
    """Tomas fixed the wheels, the question says Lena: the best-matching turn is Tomas's, so
    Lena's turns get neither the term nor the gate (LoCoMo's adversarial questions, decision 0037)."""
    index = cache.get("tomas-lena")
    query = "How many wheels did Lena fix on Saturday?"
    off = dict(speaker_term=False, speaker_gate=False)
    # the turn score alone (memory and session lead off): its best turn is Tomas's
    plain = run_search(index, _auto(memory_weight=0.0, time_weight=0.0, session_lead=0.0, **off), query, 5)
    assert turn_frame(index).named_speakers(query).any()
    assert index.turns[plain.turns[0].node_id].speaker == "Tomas"
    assert "Lena" in {index.turns[t.node_id].speaker for t in plain.turns[1:]}
    fused = run_search(index, _auto(), query, 20)
    assert not any(n.signals["named_speaker"] for n in fused.nodes)
    assert [n.node_id for n in fused.nodes] == [n.node_id for n in run_search(index, _auto(**off), query, 20).nodes]


def test_the_scored_turns_memories_vote_as_the_full_scan(cache):
    """A tenant ranked through the first stage: only the memories citing a scored turn are read, and
    the votes of the scored turns are those of the full scan (docs/decisions/0039-local-memory-signals.md)."""
    index = cache.get("tomas-lena")
    frame = turn_frame(index)
    mem = memory.memory_frame(index, frame, ("event", "fact"))
    qvec = memory.query_vector(index, np.zeros((0, 0)), "Where will Lena work from August 2024?")
    full = mem.vectors @ qvec
    pool = np.arange(0, len(frame.ids), 3)
    rows = mem.citing(pool)
    cited = {int(mem.cite_row[s]) for p in pool.tolist() for s in range(mem.cite_ptr[p], mem.cite_ptr[p + 1])}
    assert rows.tolist() == sorted(cited) and 0 < rows.size < len(mem.node_ids)
    # auto reads the memories of the scored turns' sessions: every turn of those sessions, no other
    some = pool[:4]
    wanted = set(frame.session[some].tolist())
    assert frame.session_turns(some).tolist() == [i for i in range(len(frame.ids)) if frame.session[i] in wanted]
    wider = mem.citing(frame.session_turns(pool))
    assert set(rows.tolist()) <= set(wider.tolist())
    sims = mem.vectors[rows] @ qvec
    for kind in ("fact", "event"):
        np.testing.assert_allclose(mem.votes_at(pool, wider, mem.vectors[wider] @ qvec, kind),
                                   mem.votes(full, kind)[pool], rtol=0, atol=1e-6)
        want = mem.votes(full, kind)[pool]
        got = mem.votes_at(pool, rows, sims, kind)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        assert (memory.ranks(got) == memory.ranks(want)).all() and (got > 0).any()
        np.testing.assert_array_equal(mem.votes_at(None, mem.citing(None), full, kind), mem.votes(full, kind))
    # PPR seeds come from those memories only: seeded by one of them, the same mass as a full scan
    # whose only positive cosine is that memory's
    j = int(rows[np.isin(mem.kind[rows], ["fact"])][0])
    one = np.zeros(len(mem.node_ids))
    one[j] = 0.8
    local = memory.ppr_term(index, frame, mem, np.array([0.8]), 10, ("fact",), 20000, rows=np.array([j]))
    whole = memory.ppr_term(index, frame, mem, one, 10, ("fact",), 20000)
    assert local is not None and local.max() > 0
    np.testing.assert_array_equal(local, whole)
    # auto through the first stage: every returned turn's fact vote is the full scan's
    res = run_search(index, _auto(first_stage_turns=10, candidates=8, assistant_candidates=2, expand=4,
                                  speaker_gate=False), "Where will Lena work from August 2024?", 10)
    votes = mem.votes(full, "fact")
    assert len(res.nodes) == 10
    for n in res.nodes:
        assert n.signals["fact_vote"] == pytest.approx(votes[frame.pos[n.node_id]], abs=1e-6)
