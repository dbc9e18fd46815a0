"""spaCy's pipeline is loaded once per process, also when two threads ask at once (a build's
warm-up thread and its session operator: pipelines/inline.py)."""
from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.heavy


def test_text_nlp_two_threads_asking_at_once_get_one_pipeline():
    from memlib.text.nlp import DEFAULT_MODEL, load_nlp

    disable = ("ner", "lemmatizer")  # a combination no other test loads: not cached yet
    start = threading.Barrier(2)
    got: list = []

    def ask() -> None:
        start.wait()
        got.append(load_nlp(DEFAULT_MODEL, disable))

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 2 and got[0] is got[1]
    assert got[0] is load_nlp(DEFAULT_MODEL, disable)
    assert [p for p in ("ner", "lemmatizer") if p in got[0].pipe_names] == []
