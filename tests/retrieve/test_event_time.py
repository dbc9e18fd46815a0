"""``auto`` reads the times the build resolved for events and facts (memlib/retrieve/event_time.py,
docs/decisions/0042-event-times.md): a turn whose event falls in the question's window is in it
though its session is not, an order question's two events each get their evidence, the returned
turns carry the event's date into both contexts, and a store whose memories have no times answers
from session times."""
from __future__ import annotations

import logging
from datetime import datetime, timezone

import numpy as np
import pytest

from memlib.retrieve import memory
from memlib.retrieve.event_time import format_event, span_days
from memlib.retrieve.intent import TimeQuestion, event_mentions, time_question, time_windows
from memlib.retrieve.kernels import run_search
from memlib.retrieve.registry import get_strategy
from memlib.retrieve.signals import turn_frame
from memlib.retrieve.tenant import TenantIndex
from memlib.serve.mcp_text import pack_search
from memlib.serve.models import search_response
from tests.retrieve.conftest import retrieve_config

ASKED = "2024-06-02T12:00:00+00:00"
ON_THE_EVE = "What did Maya do on 17 February 2024?"  # s2:1 (a session of 18 February): "yesterday"
WHICH_FIRST = "Which happened first, Maya accepting the job offer or signing up for the pottery class?"


def _auto(**params):
    return get_strategy("auto", retrieve_config(), **params)


def _node(res, index, source: str):
    return next(n for n in res.nodes if n.node_id == index.turn_by_source[source])


@pytest.mark.parametrize("question, kind, mentions", [
    ("Which device did I set up first, the smart thermostat or the mesh network system?", TimeQuestion.ORDER,
     ["the smart thermostat", "the mesh network system"]),
    ("Did I start yoga before or after I moved to Bristol?", TimeQuestion.ORDER,
     ["Did I start yoga", "I moved to Bristol"]),
    ("How many weeks passed between Maria adopting Coco and Shadow?", TimeQuestion.DURATION,
     ["Maria adopting Coco", "Shadow"]),
    ("How many days before the team meeting I was preparing for did I attend the workshop?", TimeQuestion.DURATION,
     ["the team meeting I was preparing for", "attend the workshop"]),
    ("How long had I been doing pottery when I went to Lisbon?", TimeQuestion.DURATION,
     ["been doing pottery", "I went to Lisbon"]),
    ("How long ago was Caroline's 18th birthday?", TimeQuestion.DURATION,
     ["How long ago was Caroline's 18th birthday"]),
    # what the assistant said, not two events: one mention
    ("You mentioned tomato juice, how long did you say I should leave it on for?", TimeQuestion.DURATION,
     ["You mentioned tomato juice, how long did you say I should leave it on for"]),
    # a "first" or an "after" that only names an event: neither
    ("When did John have his first firefighter call-out?", None, None),
    ("What did Melanie realize after the charity race?", None, None),
    ("What kind of dance piece did Gina's team perform to win first place?", None, None),
    ("Where does Raj work now?", None, None),
])
def test_order_and_duration_questions_and_the_events_they_name(question, kind, mentions):
    assert time_question(question) == kind
    if mentions is not None:
        assert event_mentions(question) == mentions


def test_this_weekend_in_a_question_is_its_own_weeks():
    tuesday = datetime(2023, 5, 30, 21, 4, tzinfo=timezone.utc)
    (start, end), = time_windows("I'm excited about my visit to the music store this weekend.", tuesday)
    assert (start.date().isoformat(), end.date().isoformat()) == ("2023-06-03", "2023-06-05")
    sunday = datetime(2023, 6, 4, 9, 0, tzinfo=timezone.utc)
    (start, end), = time_windows("What am I doing this weekend?", sunday)
    assert (start.date().isoformat(), end.date().isoformat()) == ("2023-06-03", "2023-06-05")


def test_an_events_span_is_the_one_the_build_picked():
    # memlib/extract/events.py pick_event_time: the first day/week/month mention, else the first
    assert span_days('{"dates_mentioned": [{"granularity": "year"}, {"granularity": "month"}]}') == 31.0
    assert span_days('{"dates_mentioned": [{"granularity": "year"}]}') == 366.0
    assert span_days('{"dates_mentioned": [{"granularity": "week"}, {"granularity": "day"}]}') == 7.0
    assert span_days(None) == span_days("not json") == 1.0
    said = datetime(2023, 5, 10, 13, 0, tzinfo=timezone.utc)
    wednesday = datetime(2023, 5, 3, tzinfo=timezone.utc).timestamp()
    assert format_event({"event_time": wednesday}, said) == "event 2023-05-03"
    assert format_event({"event_time": wednesday, "event_span_days": 7.0}, said) == "event week of 2023-05-03"
    assert format_event({"event_time": wednesday, "event_span_days": 31.0}, said) == "event 2023-05"
    assert format_event({"event_time": said.timestamp()}, said) == ""  # the session's own day: nothing new
    assert format_event({}, said) == ""


@pytest.mark.ray
def test_a_turn_whose_event_is_in_the_window_is_marked_though_its_session_is_not(cache):
    index = cache.get("maya")
    frame = turn_frame(index)
    # no session of Maya's is dated 17 February 2024: session times alone mark nothing
    assert memory.time_term(frame, ON_THE_EVE, ASKED) == (None, 1)
    res = run_search(index, _auto(), ON_THE_EVE, 5, question_time=ASKED)
    node = _node(res, index, "s2:1")  # "I accepted a job offer yesterday!", said on 18 February
    assert node.signals["event_window"] == 1.0 and node.signals["time_window"] == 1.0
    assert res.turns[0].turn_id == "s2:1"
    assert all(n.signals.get("time_window", 0.0) == 0.0 for n in res.nodes if n is not node)


@pytest.mark.ray
def test_an_order_questions_two_events_each_get_their_evidence(cache):
    index = cache.get("maya")
    job, pottery = index.turn_by_source["s2:1"], index.turn_by_source["s3:3"]
    assert index.turns[job].session_id != index.turns[pottery].session_id
    n = len(index.turn_order)
    res = run_search(index, _auto(), WHICH_FIRST, n)
    by_id = {x.node_id: x for x in res.nodes}
    # each mention's vote is highest at its own event's turn
    for name, turn in (("mention_vote_1", job), ("mention_vote_2", pottery)):
        best = max(by_id.values(), key=lambda x: x.signals[name])
        assert best.node_id == turn, name
    assert {job, pottery} <= {x.node_id for x in res.nodes[:3]}
    # and they carry their events' dates
    assert datetime.fromtimestamp(by_id[job].signals["event_time"], tz=timezone.utc).date().isoformat() == "2024-02-17"
    assert by_id[pottery].signals["event_span_days"] == 7.0
    # a question that is not about order or duration gets no mention votes
    plain = run_search(index, _auto(), "Where does Maya work?", n)
    assert not any(k.startswith("mention_vote") for x in plain.nodes for k in x.signals)


@pytest.mark.ray
def test_the_context_texts_show_the_events_date(cache):
    index = cache.get("maya")
    res = run_search(index, _auto(), "When did Maya accept the Harbourside Clinic job offer?", 5)
    node = _node(res, index, "s2:1")
    assert datetime.fromtimestamp(node.signals["event_time"], tz=timezone.utc).date().isoformat() == "2024-02-17"
    line = next(x for x in res.context.splitlines() if "| turns s2:1 |" in x)
    assert "| 2024-02-18 10:40 | event 2024-02-17]" in line
    text = pack_search(search_response(res, "v1", 5, 1.0))
    line = next(x for x in text.splitlines() if "turn s2:1 ·" in x)
    assert "2024-02-18 10:40 · session s2 · turn s2:1 · event 2024-02-17 · " in line
    # a turn whose event is on its session's own day shows no second date
    assert all("event" not in x for x in text.splitlines() if "turn s1:" in x)


@pytest.mark.ray
def test_a_store_whose_memories_have_no_times_answers_from_session_times(sample_store, caplog):
    """A store built before its events and facts were dated (their ``time`` column null): the windows
    read session times, one log line says so, the turns carry no event date, nothing fails."""
    from memlib.embed import get_embedder
    from memlib.io.store import StoreReader

    index = TenantIndex(StoreReader(sample_store), "maya", embedder=get_embedder(retrieve_config().embed))
    index.__dict__["time_epochs"] = np.full(index.n_nodes, np.nan)  # what such a store's node view gives
    with caplog.at_level(logging.INFO, logger="memlib.serve"):
        res = run_search(index, _auto(), ON_THE_EVE, 5, question_time=ASKED)
        again = run_search(index, _auto(), WHICH_FIRST, 5, question_time=ASKED)
    assert len(res.nodes) == 5 and len(again.nodes) == 5
    assert not any("event_window" in n.signals or "event_time" in n.signals for n in res.nodes + again.nodes)
    notes = [r for r in caplog.records if "carry no times" in r.getMessage()]
    assert len(notes) == 1 and "session times only" in notes[0].getMessage()
    # the session-time window still works: "in June 2024" is s4's month
    june = run_search(index, _auto(), "What did Maya book in June 2024?", 5, question_time=ASKED)
    assert june.nodes[0].signals.get("time_window") == 1.0
