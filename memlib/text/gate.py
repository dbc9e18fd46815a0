"""MemORAI-style memory gate and extractive segment summaries (offline, rule based).

Gate. A turn is *phatic* when, after removing function words, greeting/thanks/agreement/
farewell words and laughter, nothing is left except at most two capitalized vocatives in
a short greeting ("Hey Mel!", "Thanks, Caroline!"). Non-phatic turns get a
``memory_score`` in [0, 1] that adds evidence of user-specific content:

====================  =====  ==========================================================
signal                weight  meaning
====================  =====  ==========================================================
content words          0.30  share of up to 4 words outside the function/phatic lexicons
first person           0.20  I / my / me with at least one content word (we / our: 0.10)
life-event lexicon     0.20  preference, plan, goal, family, work, event words
capitalized name       0.20  a capitalized word that neither starts a sentence nor is a
                             vocative ("Thanks, Maria!", "Hey John")
number or date         0.15  digits, month/day names, yesterday / last week ...
====================  =====  ==========================================================

A turn is kept when it carries an image caption, or when it is not phatic and either
mentions a name, number or date, or scores at least ``GateConfig.min_score`` with at least
``min_content_words`` content words.

Summary. Each segment's sentences (speaker-prefixed, phatic ones removed) are ranked by
degree centrality (mean cosine of their content-word sets to the other sentences of the
segment, LexRank without the random walk) plus half their memory score; the best
``summary_sentences`` are returned in their original order.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import polars as pl
import pyarrow as pa

from memlib import schema
from memlib.config import GateConfig
from memlib.text import lexicon as lx
from memlib.text.structure import caption_of

SENTENCE_RE = re.compile(r"(?<=[.!?])\s+(?=\S)")
MIN_SENTENCE_WORDS = 3


@dataclass(frozen=True)
class Signals:
    """Token-level evidence of one text, shared by :func:`is_phatic` and :func:`memory_score`."""
    n_tokens: int
    content: tuple[str, ...]
    first_person: bool
    first_person_plural: bool
    life_event: bool
    name: bool
    number_or_date: bool
    has_digit: bool
    greeting: bool


_BREAK = re.compile(r"[.!?,:;]")
_DIGIT = re.compile(r"\d")


def _is_name(tok: str, prev: str | None, gap: str) -> bool:
    """A capitalized word that is not sentence-initial and not a vocative after a greeting/comma."""
    low = tok.lower()
    if not tok[:1].isupper() or tok == "I" or low in lx.FUNCTION_WORDS or low in lx.PHATIC_WORDS:
        return False
    if prev is None or _BREAK.search(gap):
        return False
    prev_low = prev.lower()
    return prev_low not in lx.PHATIC_WORDS and prev_low not in lx.GREETING_MARKERS


@lru_cache(maxsize=1 << 16)
def signals(text: str) -> Signals:
    """Extract the lexicon signals of ``text`` (cached: chat text repeats a lot)."""
    text = text or ""
    toks, name, prev, end = [], False, None, 0
    for m in lx.WORD_RE.finditer(text):
        tok = m.group().replace("’", "'")
        name = name or _is_name(tok, prev, text[end:m.start()])
        toks.append(tok)
        prev, end = tok, m.end()
    low = [t.lower() for t in toks]
    content = tuple(t for t, w in zip(toks, low) if w not in lx.FUNCTION_WORDS
                    and w not in lx.PHATIC_WORDS and not lx.LAUGH_RE.match(w))
    has_digit = _DIGIT.search(text) is not None
    number = has_digit or not lx.MONTHS.isdisjoint(low) or _has_relative_date(low)
    return Signals(
        n_tokens=len(toks), content=content,
        first_person=not lx.FIRST_PERSON.isdisjoint(low),
        first_person_plural=not lx.FIRST_PERSON_PLURAL.isdisjoint(low),
        life_event=not lx.SIGNAL_WORDS.isdisjoint(low),
        name=name, number_or_date=number, has_digit=has_digit,
        greeting=not lx.GREETING_MARKERS.isdisjoint(low),
    )


def _has_relative_date(low: list[str]) -> bool:
    if any(w in ("yesterday", "tomorrow", "tonight") for w in low):
        return True
    pairs = zip(low, low[1:])
    return any(a in ("last", "next", "this") and b in lx.TEMPORAL_WORDS for a, b in pairs) or "ago" in low


def is_phatic(text: str) -> bool:
    """True for pure social turns: greetings, thanks, laughter, agreement, farewells."""
    sig = signals(text)
    if sig.n_tokens == 0 or not sig.content:
        return not sig.has_digit
    if sig.has_digit:
        return False
    vocatives = all(t[:1].isupper() for t in sig.content) and len(sig.content) <= 2
    return vocatives and sig.greeting and sig.n_tokens <= 12


def _score(sig: Signals) -> float:
    score = 0.30 * min(len(sig.content) / 4.0, 1.0)
    if sig.content:
        score += 0.20 if sig.first_person else 0.10 if sig.first_person_plural else 0.0
    score += 0.20 * sig.life_event
    score += 0.20 * sig.name
    score += 0.15 * sig.number_or_date
    return float(min(score, 1.0))


def memory_score(text: str) -> float:
    """Evidence in [0, 1] that ``text`` carries user-specific, memorable content (0 if phatic)."""
    return 0.0 if is_phatic(text) else _score(signals(text))


def keep_turn(text: str, has_caption: bool, cfg: GateConfig) -> bool:
    """The gate decision for one turn."""
    if has_caption:
        return True
    if is_phatic(text):
        return False
    sig = signals(text)
    if sig.name or sig.number_or_date:
        return True
    return len(sig.content) >= cfg.min_content_words and _score(sig) >= cfg.min_score


def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in SENTENCE_RE.split((text or "").strip()) if s.strip()]


def _bag(sentence: str) -> set[str]:
    out = set()
    for w in lx.words(sentence):
        low = w.lower()
        if low in lx.FUNCTION_WORDS or low in lx.PHATIC_WORDS:
            continue
        out.add(low[:-1] if len(low) > 3 and low.endswith("s") and not low.endswith("ss") else low)
    return out


def centrality(sentences: list[str]) -> np.ndarray:
    """Mean cosine of each sentence's content-word set to the other sentences."""
    bags = [_bag(s) for s in sentences]
    vocab = {w: i for i, w in enumerate(sorted(set().union(*bags)))} if bags else {}
    m = np.zeros((len(bags), max(len(vocab), 1)), dtype=np.float32)
    for r, bag in enumerate(bags):
        m[r, [vocab[w] for w in bag]] = 1.0
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    m = m / np.maximum(norms, 1e-9)
    sim = m @ m.T
    np.fill_diagonal(sim, 0.0)
    return sim.sum(axis=1) / max(len(bags) - 1, 1)


def summarize(speakers: list[str | None], texts: list[str], n_sentences: int) -> str:
    """Extractive summary: the top ``n_sentences`` (at least 2 where available) central,
    content-bearing sentences in their original order; empty for a purely phatic segment."""
    cands = []
    for spk, text in zip(speakers, texts):
        for s in split_sentences(text):
            cands.append((spk, s))
    pool = [(spk, s) for spk, s in cands if len(lx.words(s)) >= MIN_SENTENCE_WORDS and not is_phatic(s)]
    if not pool:  # a purely phatic segment has nothing to remember
        return ""
    sents = [s for _, s in pool]
    score = centrality(sents) + 0.5 * np.array([memory_score(s) for s in sents])
    k = min(max(n_sentences, 2), len(pool))
    chosen = sorted(np.argsort(-score, kind="stable")[:k].tolist())
    return " ".join(f"{pool[i][0]}: {pool[i][1]}" if pool[i][0] else pool[i][1] for i in chosen)


def gate_flags(turns: pa.Table, cfg: GateConfig | None = None) -> pa.Array:
    """Boolean keep flag for every turn row."""
    cfg = cfg or GateConfig()
    texts = turns.column("text").to_pylist()
    extras = turns.column("extras").to_pylist()
    return pa.array([keep_turn(t, caption_of(e) is not None, cfg) for t, e in zip(texts, extras)],
                    type=pa.bool_())


def gate_turns(turns: pa.Table, segments: pa.Table, cfg: GateConfig | None = None) -> pa.Table:
    """SEGMENTS with ``kept_turn_ids`` (gate survivors, in order) and ``summary`` filled."""
    cfg = cfg or GateConfig()
    tdf = pl.from_arrow(turns.select(["node_id", "speaker", "text"])).with_columns(
        pl.Series("keep", gate_flags(turns, cfg)))
    seg = pl.from_arrow(segments).drop(["kept_turn_ids", "summary"]).with_row_index("_seg")
    exploded = seg.select("_seg", "turn_ids").explode("turn_ids").with_row_index("_pos").join(
        tdf, left_on="turn_ids", right_on="node_id", how="left", maintain_order="left")
    per_seg = exploded.sort("_pos").group_by("_seg", maintain_order=True).agg(
        pl.col("turn_ids").filter(pl.col("keep").fill_null(False)).alias("kept_turn_ids"),
        pl.col("speaker"), pl.col("text").fill_null(""),
    )
    summaries = [summarize(spk, txt, cfg.summary_sentences)
                 for spk, txt in zip(per_seg["speaker"].to_list(), per_seg["text"].to_list())]
    per_seg = per_seg.with_columns(pl.Series("summary", summaries, dtype=pl.String)).select(
        "_seg", "kept_turn_ids", "summary")
    out = seg.join(per_seg, on="_seg", how="left", maintain_order="left").with_columns(
        pl.col("kept_turn_ids").fill_null(pl.lit([], dtype=pl.List(pl.String))))
    return schema.conform(out.to_arrow(), schema.SEGMENTS, name="gated_segments")
