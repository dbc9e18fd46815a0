"""GAAMA concepts: 2-5 word snake_case topic labels from noun chunks, canonicalized per tenant.

Labels are lemmatized and lowercased; person names, speakers, dates, numbers and generic
words never enter a label. Canonicalization merges labels whose stemmed token sets are
equal ("pottery classes" / "pottery class") or whose token-set Jaccard similarity reaches
the configured threshold; the most frequent surface label names the merged concept.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from memlib.extract.rows import concept_id

GENERIC = frozenset("""thing things stuff time times day days lot lots way ways kind sort bit something anything
everything nothing someone anyone everyone people person guy guys one ones part place moment moments week weeks
month months year years today tomorrow yesterday night morning evening weekend idea ideas fun question questions
stuff everything life world sense matter point fact reason bunch couple number deal""".split())
EVALUATIVE = frozenset("""good great amazing awesome nice cool wonderful fantastic lovely beautiful incredible bad
hard tough huge big little small real whole other same such own many much few last next first best better
favorite favourite special super awesome cute sweet glad happy sure true whole different several""".split())
EXCLUDED_ENTS = frozenset({"PERSON", "DATE", "TIME", "CARDINAL", "ORDINAL", "QUANTITY", "MONEY", "PERCENT"})
LIGHT_VERBS = frozenset({"be", "have", "do", "get", "make", "go", "say", "think", "know", "feel", "see",
                         "want", "let", "take", "give", "come", "seem", "look", "keep", "put", "try", "mean"})
_KEEP_POS = {"NOUN", "PROPN", "ADJ", "VERB"}
MIN_WORDS, MAX_WORDS = 2, 5


def stem(word: str) -> str:
    """Crude plural folding on top of the lemmatizer (covers mis-tagged plurals)."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _usable(tok: Any, names: set[str]) -> bool:
    if tok.pos_ not in _KEEP_POS or tok.is_stop or tok.like_num or not tok.is_alpha:
        return False
    if tok.ent_type_ in EXCLUDED_ENTS or tok.lower_ in names:
        return False
    lemma = tok.lemma_.lower()
    if lemma in GENERIC or lemma in EVALUATIVE or tok.lower_ in GENERIC:
        return False
    return tok.pos_ != "ADJ" or tok.dep_ in ("amod", "compound")


def _chunk_words(chunk: Any, names: set[str]) -> list[str]:
    root = chunk.root
    if root.ent_type_ in EXCLUDED_ENTS or root.lower_ in names or root.lemma_.lower() in GENERIC:
        return []
    return [t.lemma_.lower() for t in chunk if _usable(t, names)]


def _verb_object(chunk: Any, names: set[str], words: list[str]) -> list[str]:
    verb = chunk.root.head
    if chunk.root.dep_ != "dobj" or verb.pos_ != "VERB" or verb.lemma_.lower() in LIGHT_VERBS:
        return []
    return [verb.lemma_.lower(), *words]


def chunks_by_sentence(doc: Any) -> dict[int, list[Any]]:
    """The doc's noun chunks grouped by the start of the sentence holding them, computed once
    (``Span.noun_chunks`` walks every chunk of the doc for each sentence: quadratic in long turns)."""
    starts = [s.start for s in doc.sents]
    out: dict[int, list[Any]] = {s: [] for s in starts}
    i = 0
    for chunk in doc.noun_chunks:
        while i + 1 < len(starts) and starts[i + 1] <= chunk.start:
            i += 1
        out[starts[i]].append(chunk)
    return out


def concept_labels(span: Any, names: set[str], limit: int = 3, chunks: list[Any] | None = None) -> list[str]:
    """Up to ``limit`` snake_case concept labels for a sentence span; ``names`` are lowercase
    tokens of people (speakers) that must never appear in a label. ``chunks``: the span's noun
    chunks when the caller has them (:func:`chunks_by_sentence`)."""
    out: list[str] = []
    if chunks is None:
        chunks = list(span.noun_chunks)
    for chunk in chunks:
        if chunk.end > span.end:  # a chunk crossing the sentence end is not the sentence's
            continue
        words = _chunk_words(chunk, names)
        if len(words) == 1:
            words = _verb_object(chunk, names, words)
        words = words[-MAX_WORDS:]
        if len(words) < MIN_WORDS or len(set(words)) < len(words):
            continue
        label = "_".join(words)
        if label not in out:
            out.append(label)
        if len(out) >= limit:
            break
    return out


def token_key(label: str) -> str:
    return "_".join(sorted({stem(w) for w in label.split("_")}))


def cluster(keys: list[str], threshold: float, groups: Iterable[Iterable[str]] | None = None) -> dict[str, str]:
    """Union keys whose token sets have Jaccard >= threshold; key -> representative key (the
    smallest key of its cluster).

    ``groups``: clusters already known (docs/decisions/0035-incremental-canonicalization.md):
    each is united as it is, and only the keys of no group are compared, each with every key.
    The clusters are those of comparing every pair when the groups are clusters of a subset of
    ``keys``' pairs (every key of a group is in ``keys``, and a pair of grouped keys above the
    threshold is in one group): a pair of ungrouped keys or of a grouped and an ungrouped one
    is compared here, a pair of grouped keys is in one group."""
    parent = {k: k for k in keys}

    def find(k: str) -> str:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    def union(a: str, b: str) -> None:
        a, b = find(a), find(b)
        parent[max(a, b)] = min(a, b)

    sets = {k: frozenset(k.split("_")) for k in keys}
    index: dict[str, list[str]] = defaultdict(list)
    for k in keys:
        for w in sets[k]:
            index[w].append(k)
    todo: Iterable[str] = keys
    if groups is not None:
        grouped: set[str] = set()
        for group in groups:
            members = list(group)
            for m in members[1:]:
                union(members[0], m)
            grouped.update(members)
        todo = [k for k in keys if k not in grouped]
    for k in todo:
        cands = {c for w in sets[k] for c in index[w] if (c > k if groups is None else c != k)}
        for c in cands:
            inter = len(sets[k] & sets[c])
            if inter / len(sets[k] | sets[c]) >= threshold:
                union(k, c)
    return {k: find(k) for k in keys}


def canonicalize(occurrences: Iterable[tuple[str, str]], threshold: float) -> dict[tuple[str, str], tuple[str, str]]:
    """(tenant_id, label) occurrences -> per distinct pair its (concept_id, canonical label); the
    canonical label of a cluster is its most frequent, the smallest of those tied."""
    counts = Counter(occurrences)
    labels: dict[str, list[str]] = defaultdict(list)
    for tenant, label in counts:
        labels[tenant].append(label)
    out = {}
    for tenant, names in labels.items():
        keys = {name: token_key(name) for name in names}
        rep = cluster(sorted(set(keys.values())), threshold)
        best: dict[str, str] = {}
        for name in sorted(names, key=lambda n: (-counts[tenant, n], n)):
            best.setdefault(rep[keys[name]], name)
        for name in names:
            canonical = best[rep[keys[name]]]
            out[tenant, name] = (concept_id(tenant, token_key(canonical)), canonical)
    return out
