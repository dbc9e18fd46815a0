"""RAKE + IDF keyphrases."""
from __future__ import annotations

import random
import time

import pytest

from memlib.text.keyphrases import candidates, keyphrases, singular

DOCS = [
    "I went to an LGBTQ support group yesterday. The LGBTQ support group was so powerful.",
    "We are researching adoption agencies. Adoption agencies have long waiting lists.",
    "I signed up for a pottery class. My pottery class meets on Tuesdays at the art center.",
]


def test_text_keyphrases_find_topic_phrases():
    out = keyphrases(DOCS, 3)
    assert len(out) == 3 and all(1 <= len(k) <= 3 for k in out)
    assert out[0][0] == "LGBTQ support group"
    assert "adoption agencies" in [k.lower() for k in out[1]]
    assert any("pottery class" in k for k in out[2])  # RAKE has no POS: may be "pottery class meets"
    assert keyphrases(["Researching adoption agencies is slow."], 1) == [["adoption agencies"]]


def test_text_keyphrases_no_stopword_only_or_nested_duplicates():
    out = keyphrases(DOCS, 5)
    for phrases in out:
        low = [p.lower() for p in phrases]
        assert not any(a != b and f" {a} " in f" {b} " for a in low for b in low)
        assert all(p not in ("the", "so", "was", "yesterday") for p in low)


def test_text_keyphrases_exclude_and_plural_folding():
    out = keyphrases(["Caroline loves pottery classes. Caroline took a pottery class."], 3, exclude={"caroline"})
    assert all("caroline" not in p.lower() for p in out[0])
    assert sum("pottery class" in p for p in out[0]) == 1
    assert singular("agencies") == "agency" and singular("classes") == "class" and singular("bus") == "bus"


def test_text_candidates_split_on_stopwords_and_punctuation():
    assert candidates("I love hiking, camping trips and sourdough bread!") == [
        ["hiking"], ["camping", "trips"], ["sourdough", "bread"]]


@pytest.mark.heavy
def test_text_keyphrases_speed_24k_turns():
    rng = random.Random(0)
    vocab = ["garden", "marathon", "pottery", "class", "guitar", "adoption", "agency", "camping", "trip",
             "bakery", "sourdough", "bread", "meteor", "shower", "concert", "violin", "school", "charity"]
    texts = [f"I {rng.choice(['joined', 'loved', 'planned'])} the {rng.choice(vocab)} {rng.choice(vocab)} "
             f"with my {rng.choice(vocab)} friends last week, and the {rng.choice(vocab)} was great!"
             for _ in range(24_000)]
    t0 = time.perf_counter()
    out = keyphrases(texts, 5)
    elapsed = time.perf_counter() - t0
    assert len(out) == 24_000 and all(out)
    assert elapsed < 15, f"keyphrases took {elapsed:.1f}s for 24k turns"


def test_rank_flat_equals_rank_with_ties_and_short_heads():
    """The numpy ranking gives :func:`rank`'s phrases: equal weights broken by the key (UTF-8
    order, non-ASCII keys included), nested keys skipped, a document whose first keys do not give
    ``n`` phrases read in full."""
    import numpy as np
    import pyarrow as pa

    from memlib.text.keyphrases import rank, rank_flat

    rng = np.random.default_rng(3)
    vocab = ["tea", "green tea", "tea cup", "café", "cafe", "zebra", "apple pie", "apple", "pie", "éclair",
             "blue sky", "sky", "a b", "b"] + [f"w{i}" for i in range(40)]
    per_doc = []
    for d in range(60):
        keys = list(rng.choice(vocab, size=int(rng.integers(0, 30)), replace=False))
        if d % 7 == 0:  # one key nested in the next: a document that reads past its first keys
            keys = [f"x{d}"] + [f"x{d} y{j}" for j in range(25)]
        scores = {k: float(rng.choice([1.0, 2.0, 2.5])) for k in keys}
        per_doc.append((scores, {k: k.upper() for k in keys}))
    doc = np.repeat(np.arange(len(per_doc)), [len(s) for s, _ in per_doc])
    keys = pa.array([k for s, _ in per_doc for k in s], pa.string())
    scores = np.array([v for s, _ in per_doc for v in s.values()], dtype=np.float64)
    surfaces = pa.array([f[k] for s, f in per_doc for k in s], pa.string())
    for n in (1, 3, 5):
        assert rank_flat(doc, keys, scores, surfaces, len(per_doc), n) == rank(per_doc, n)
