"""Memory gate and extractive segment summaries."""
from __future__ import annotations

import re

import pytest

from memlib import schema
from memlib.config import GateConfig, SegmentConfig
from memlib.text.gate import gate_turns, is_phatic, memory_score, split_sentences, summarize
from memlib.text.segment import segment_turns
from tests.text.conftest import make_turns, topic_vectors

PHATIC = ["Hey!", "Thanks!", "haha", "Good to see you!", "Bye, take care", "Hey Mel! Good to see you!",
          "Thanks, Caroline!", "Wow, that's cool!", "lol same", "I'm doing great, thanks!", ""]
FACTUAL = ["I adopted a rescue dog named Biscuit last week. He is a beagle.",
           "My goal is to run the Boston marathon in April 2024.",
           "I started a pottery class at the community center.", "My daughter turns 7 on June 3.",
           "We bought a sailboat in Maine.", "I moved to Denver for a new job at a bakery."]


@pytest.mark.parametrize("text", PHATIC)
def test_text_phatic_detected(text):
    assert is_phatic(text)
    assert memory_score(text) == 0.0


@pytest.mark.parametrize("text", FACTUAL)
def test_text_factual_not_phatic(text):
    assert not is_phatic(text)
    assert memory_score(text) >= GateConfig().min_score


def test_text_score_orders_specific_above_generic():
    assert memory_score("I adopted a dog named Biscuit in May.") > memory_score("Did you hear any stories?")


def test_text_gate_keeps_facts_drops_phatic(turns):
    segs = segment_turns(turns, topic_vectors([0] * turns.num_rows), SegmentConfig(min_turns=2))
    gated = gate_turns(turns, segs)
    schema.check(gated, schema.SEGMENTS)
    kept = {t for ks in gated.column("kept_turn_ids").to_pylist() for t in ks}
    text_of = dict(zip(turns.column("node_id").to_pylist(), turns.column("text").to_pylist()))
    kept_text = {text_of[t] for t in kept}
    for t in ("Hey Ben! Good to see you!", "Hi Ana! Thanks!", "haha", "Thanks!", "Bye, take care",
              "Wow, that's cool!", "Good to see you!"):
        assert t not in kept_text
    for t in FACTUAL:
        assert t in kept_text
    # kept turns keep segment order and are a subset of the segment's turns
    for all_ids, kept_ids in zip(gated.column("turn_ids").to_pylist(), gated.column("kept_turn_ids").to_pylist()):
        assert [t for t in all_ids if t in set(kept_ids)] == kept_ids
    assert gated.column("segment_id").equals(segs.column("segment_id"))


def test_text_caption_turn_kept_even_if_phatic():
    turns = make_turns([("t", "c", "S", 0, "Ana", "Look!", {"blip_caption": "a photo of a cake"}),
                        ("t", "c", "S", 0, "Ben", "Look!", None)])
    segs = segment_turns(turns, topic_vectors([0, 0]), SegmentConfig(min_turns=1))
    kept = gate_turns(turns, segs).column("kept_turn_ids").to_pylist()[0]
    assert kept == [turns.column("node_id")[0].as_py()]


def test_text_summary_two_to_three_sentences_from_segment(turns):
    segs = segment_turns(turns, topic_vectors([0] * turns.num_rows, noise=0.0), SegmentConfig(min_turns=2))
    assert segs.num_rows == 3  # identical vectors: one segment per session
    gated = gate_turns(turns, segs, GateConfig(summary_sentences=3))
    sources = {s for t in turns.column("text").to_pylist() for s in split_sentences(t)}
    counts = []
    for summary in gated.column("summary").to_pylist():
        parts = [p.split(": ", 1)[1] for p in _speaker_sentences(summary)]
        assert all(p in sources for p in parts)
        assert not any(is_phatic(p) for p in parts)
        counts.append(len(parts))
    assert counts == [3, 2, 2]


def test_text_summary_empty_for_phatic_segment():
    assert summarize(["A", "B", "A"], ["Hey Ben!", "Hi! Good to see you!", "haha"], 3) == ""


def _speaker_sentences(summary: str) -> list[str]:
    """Split a summary into its speaker-prefixed sentences (fixture speakers only)."""
    return [p.strip() for p in re.split(r"(?=\b(?:Ana|Ben|Zed|Yan): )", summary) if p.strip()]


def test_text_summarize_keeps_original_order_and_prefers_central():
    speakers = ["A", "B", "A", "B", "A"]
    texts = ["Hey!", "I bake sourdough bread every weekend.", "The weather was grey.",
             "My sourdough bread starter is ten years old.", "I sell sourdough bread at the market."]
    out = summarize(speakers, texts, 2)
    parts = re.split(r"(?=\b[AB]: )", out)
    parts = [p.strip() for p in parts if p.strip()]
    assert len(parts) == 2 and all("sourdough" in p for p in parts)
    positions = [out.index(p) for p in parts]
    order = [next(i for i, t in enumerate(texts) if t in p) for p in parts]
    assert order == sorted(order) and positions == sorted(positions)
