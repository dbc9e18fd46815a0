"""Pure units: intent router, CMI weight fitting, MaxSim kernel, session/adjacent signals."""
from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pytest

from memlib.retrieve import cmi
from memlib.retrieve.intent import Intent, route, time_windows
from memlib.retrieve.late import TokenMatrix, maxsim, token_idf


@pytest.mark.parametrize("q,intent", [
    ("Why did Melanie choose to adopt?", Intent.WHY),
    ("What inspired Caroline to paint?", Intent.WHY),
    ("When did Caroline go to the support group?", Intent.WHEN),
    ("How long has Ben lived in Glasgow?", Intent.WHEN),
    ("Who gave Ana the feather toy?", Intent.ENTITY),
    ("Where did Ben find a flat?", Intent.ENTITY),
    ("What is the name of Ana's kitten?", Intent.ENTITY),
    ("What does Cara practise every evening?", Intent.OTHER),
])
def test_intent_router(q, intent):
    assert route(q) is intent


def test_time_windows_month():
    anchor = datetime(2023, 9, 1, tzinfo=timezone.utc)
    (start, end), = time_windows("What happened in May 2023?", anchor)
    assert start.year == 2023 and start.month == 5 and (end - start).days >= 28
    assert time_windows("What does Cara bake?", anchor) == []


def test_cmi_prefers_informative_signal():
    rng = np.random.default_rng(0)
    n = 3000
    labels = rng.random(n) < 0.2
    informative = np.where(labels, 0, rng.integers(0, 3, n))     # positives always in the top bin
    noise = rng.integers(0, 3, n)
    bins = np.stack([informative, noise, noise], axis=1)
    types = np.where(np.arange(n) % 2 == 0, "when", "other")
    fitted = cmi.fit_weights(types, bins, labels, temperature=0.05)
    for t in ("when", "other"):
        w = fitted[t]["weights"]
        assert w["relevance"] > 0.9 and abs(sum(w.values()) - 1) < 1e-9
        assert fitted[t]["cmi"]["relevance"] > 10 * fitted[t]["cmi"]["importance"]


def test_cmi_fallback_and_bins(tmp_path):
    assert cmi.load_weights(tmp_path / "missing.json") == {}
    assert cmi.weights_for({}, "why") == cmi.FALLBACK_WEIGHTS
    assert cmi.rank_bins(np.array([0.1, 0.9, 0.5, 0.3, 0.8, 0.0])).tolist() == [2, 0, 1, 1, 0, 2]
    assert cmi.mutual_information(np.array([0, 1, 2, 0]), np.array([1, 0, 0, 1])) > 0


def test_maxsim_idf():
    vec = np.eye(3, dtype=np.float32)
    owner = np.array([0, 0, 1, 2], dtype=np.int32)
    tok = np.array([0, 1, 1, 2])
    idf = token_idf(owner, tok, 3, 3)
    assert idf[0] > idf[1]  # token 0 is rarer than token 1
    m = TokenMatrix(("a", "b", "c"), owner, vec[[0, 1, 1, 2]], idf)
    s = maxsim(m, np.array([0, 1]), vec[[0, 1]])
    assert s.argmax() == 0 and s[1] > s[2] == 0
    assert maxsim(m, np.array([0, 1]), vec[[0, 1]], use_idf=False).tolist() == [2.0, 1.0, 0.0]


def test_turn_frame_signals():
    from memlib.retrieve.signals import TurnFrame

    frame = TurnFrame.__new__(TurnFrame)
    frame.session = np.array([0, 0, 0, 1, 1])
    frame.n_sessions = 2
    s = np.array([1.0, 5.0, 2.0, 0.0, 4.0])
    assert frame.session_prior(s, 2).tolist() == [3.5, 3.5, 3.5, 2.0, 2.0]
    assert frame.adjacent(s).tolist() == [5.0, 2.0, 5.0, 4.0, 0.0]


def test_session_leaders():
    from memlib.retrieve.signals import TurnFrame

    frame = TurnFrame.__new__(TurnFrame)
    frame.session = np.array([0, 0, 0, 1, 1])
    frame.n_sessions = 2
    s = np.array([1.0, 5.0, 5.0, 0.0, 4.0])
    assert frame.session_leaders(s).tolist() == [False, True, False, False, True]  # tie: the earlier turn
    assert frame.session_leaders(np.zeros(0)).tolist() == []
