"""Rewrite first person (and, in two-party talks, second person) as named speakers.

Works on a parsed spaCy sentence span: "I'm adopting my dog" said by Caroline becomes
"Caroline is adopting Caroline's dog"; verbs whose subject became a third-person name are
put in the third person singular ("I love" -> "Caroline loves", "I don't" -> "Caroline
doesn't").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_SUBJECT_SELF = {"i"}
_OBJECT_SELF = {"me", "myself"}
_POSS_SELF = {"my", "mine"}
_GROUP = {"we", "us", "ourselves"}
_POSS_GROUP = {"our", "ours"}
_YOU = {"you", "yourself"}
_POSS_YOU = {"your", "yours"}
_GENERIC_YOU = {"know", "see", "thank", "thanks", "guys", "mean"}
_CONTRACTIONS = {"'m": " is", "’m": " is", "'re": " is", "’re": " is", "'ve": " has", "’ve": " has",
                 "'ll": " will", "’ll": " will"}
_IRREGULAR = {"be": "is", "am": "is", "are": "is", "have": "has", "do": "does", "go": "goes", "were": "was"}


@dataclass
class Rewrite:
    text: str
    first_person: bool
    people: list[str] = field(default_factory=list)  # speakers named by the rewrite


def third_singular(token: Any) -> str:
    """Third person singular present of a verb token ("love" -> "loves", "do" -> "does")."""
    low = token.lower_
    if low in _IRREGULAR:
        return _IRREGULAR[low]
    lemma = token.lemma_.lower() or low
    if lemma in _IRREGULAR:
        return _IRREGULAR[lemma]
    if lemma.endswith(("s", "sh", "ch", "x", "z", "o")):
        return lemma + "es"
    if len(lemma) > 1 and lemma.endswith("y") and lemma[-2] not in "aeiou":
        return lemma[:-1] + "ies"
    return lemma + "s"


def _group_name(span: Any, speaker: str, other: str | None) -> str:
    lowered = {t.lower_ for t in span}
    if other and (lowered & (_YOU | _POSS_YOU | {"together", "both"}) or other.lower() in span.text.lower()):
        return f"{speaker} and {other}"
    return f"{speaker} and others"


def _is_generic_you(tok: Any) -> bool:
    nxt = tok.nbor(1).lower_ if tok.i + 1 < len(tok.doc) else ""
    prev = tok.nbor(-1).lower_ if tok.i > 0 else ""
    return nxt in _GENERIC_YOU or prev in _GENERIC_YOU


def _replacement(tok: Any, speaker: str, other: str | None, group: str) -> tuple[str | None, bool]:
    """(replacement text or None, whether it is a singular subject needing agreement)."""
    low = tok.lower_
    subj = tok.dep_ in ("nsubj", "nsubjpass")
    if low in _SUBJECT_SELF or low in _OBJECT_SELF:
        return speaker, subj
    if low in _POSS_SELF:
        return f"{speaker}'s", False
    if low in _GROUP:
        return group, False
    if low in _POSS_GROUP:
        return (f"{group}'" if group.endswith("s") else f"{group}'s"), False
    if other and tok.pos_ == "PRON" and not _is_generic_you(tok):
        if low in _YOU:
            return other, subj
        if low in _POSS_YOU:
            return f"{other}'s", False
    return None, False


def _agreement_targets(tok: Any) -> list[Any]:
    """Verb tokens that must agree with a subject ``tok`` turned into a third-person name."""
    head = tok.head
    cands = [c for c in head.children if c.dep_ in ("aux", "auxpass") and c.i > tok.i]
    if head.i > tok.i:
        cands.append(head)
    return [c for c in cands if c.tag_ == "VBP" or c.lower_ in ("am", "are", "were") or c.lower_ in _CONTRACTIONS]


def rewrite_speaker(span: Any, speaker: str | None, other: str | None = None) -> Rewrite:
    """``span`` with first/second person replaced by the speaker / the other speaker."""
    pieces = [t.text_with_ws for t in span]
    if not speaker:
        return Rewrite("".join(pieces).strip(), False)
    group = _group_name(span, speaker, other)
    start = span.start
    first, people = False, set()
    for tok in span:
        repl, agree = _replacement(tok, speaker, other, group)
        if repl is None:
            continue
        pieces[tok.i - start] = repl + tok.whitespace_
        first = first or tok.lower_ not in (_YOU | _POSS_YOU)
        people.update(p for p in (speaker, other) if p and p in repl)
        if agree:
            for verb in _agreement_targets(tok):
                if span.start <= verb.i < span.end:
                    form = _CONTRACTIONS.get(verb.lower_) or third_singular(verb)
                    pieces[verb.i - start] = form + verb.whitespace_
    return Rewrite("".join(pieces).strip(), first, sorted(people))
