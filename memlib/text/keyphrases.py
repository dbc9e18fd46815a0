"""Unsupervised keyphrases: RAKE candidates re-weighted by corpus IDF.

Candidates are maximal runs of 1-4 words between stop words and punctuation (RAKE, Rose et
al. 2010). Within a document a word scores degree/frequency (how much it co-occurs inside
candidates relative to how often it occurs); a candidate scores the sum of its words'
scores times ``1 + log(tf)``. Across the batch of documents passed in, each candidate key is
weighted by a smoothed IDF so phrases that appear everywhere (speaker names, filler) sink
and document-specific topics rise. Keys are lowercased with the last word singularized, so
"adoption agencies" and "adoption agency" are one phrase. Pure Python over regex tokens:
about 2-3 s for 24k chat turns on one core (see ``tests/text``).
"""
from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memlib.text import lexicon as lx

TOKEN_RE = re.compile(
    r"\d+(?:[.,:/]\d+)*(?:st|nd|rd|th|s)?\b|[A-Za-z][A-Za-z0-9'’\-]*[A-Za-z0-9]|[A-Za-z]|[^\sA-Za-z0-9]")
MAX_WORDS = 4
MIN_CHARS = 3

EXTRA_STOP = frozenset("""
new old big little small best better worse hard tough important special different whole real
keep kept help helps helped helping mean means meant find found give gave given put let lets
looks looked looking hope share sharing shared remember reminds remind makes making doing done
having trying started start use used using work worked bring brings brought enjoy enjoyed love
loved loving like liked likes glad happy proud excited thankful grateful cute beautiful lovely
awesome amazing cool fun great good nice wonderful incredible fantastic perfect interesting
inspiring powerful difference moment moments memories memory life people person guy guys
part anyway thanks thank let's it'd that'd there'd who'd what'd can't won't don't didn't
here's gonna wanna kinda lots place places stuff idea ideas sure must might may shall last next
this around since every far beyond besides another coming always lot's whatever one two three four
us five six seven eight nine ten first second third couple few several anymore within without along
""".split())

STOP = lx.FUNCTION_WORDS | lx.PHATIC_WORDS | EXTRA_STOP


def _norm(word: str) -> str:
    return word.replace("’", "'").lower()


def singular(word: str) -> str:
    """Light plural folding of a lowercase word (agencies -> agency, classes -> class)."""
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("sses", "shes", "ches", "xes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


AUXILIARIES = frozenset("am is are was were be been being i'm you're we're they're he's she's it's".split())


def candidates(text: str) -> list[list[str]]:
    """RAKE candidate phrases of ``text`` as lists of surface words."""
    out, run, after_aux, prev = [], [], [], ""  # prev: the stop word before the current run
    for tok in TOKEN_RE.findall(text or ""):
        low = _norm(tok)
        if not tok[0].isalpha() or low in STOP:
            if run:
                out.append(run)
                after_aux.append(prev in AUXILIARIES)
            run, prev = [], low
            continue
        word = tok.replace("’", "'")
        run.append(word[:-2] if word.endswith("'s") and len(word) > 3 else word)
    if run:
        out.append(run)
        after_aux.append(prev in AUXILIARIES)
    out = [_trim_verbs(r, aux) for r, aux in zip(out, after_aux)]
    return [r for r in out if len(r) <= MAX_WORDS and sum(map(len, r)) >= MIN_CHARS]


def _trim_verbs(run: list[str], after_aux: bool) -> list[str]:
    """Drop a leading verb form: sentence-initial ("Researching adoption agencies") or after an
    auxiliary ("are researching adoption agencies"); other lowercase ones stay, since
    "camping trips" or "roasted marshmallows" are noun phrases."""
    while len(run) > 1 and run[1].islower() and run[0].lower().endswith(("ing", "ed")) \
            and (after_aux or (run[0][:1].isupper() and run[0][1:].islower())):
        run = run[1:]
    return run


def _key(words: list[str]) -> str:
    low = [_norm(w) for w in words]
    low[-1] = singular(low[-1])
    return " ".join(low)


def _rake_scores(cands: list[list[str]],
                 lows: list[list[str]] | None = None) -> tuple[dict[str, float], dict[str, str]]:
    """Per-document RAKE score and first surface form of every candidate key; ``lows``: the
    candidates' words normalized (:func:`_norm`), when the caller has them."""
    if lows is None:
        lows = [[_norm(w) for w in c] for c in cands]
    freq: Counter[str] = Counter()
    degree: Counter[str] = Counter()
    for low in lows:
        size = len(low)
        for lw in low:
            freq[lw] += 1
            degree[lw] += size
    tf: Counter[str] = Counter()
    surface: dict[str, str] = {}
    base: dict[str, float] = {}
    for c, low in zip(cands, lows):
        last = singular(low[-1])
        k = " ".join(low) if last == low[-1] else " ".join([*low[:-1], last])
        tf[k] += 1
        if k not in surface:
            surface[k] = " ".join(c)
            base[k] = sum([degree[lw] / freq[lw] for lw in low])
    return {k: base[k] * (1.0 + math.log(tf[k])) for k in tf}, surface


def _select(ranked: list[str], n: int) -> list[str]:
    """Top ``n`` keys, skipping keys contained in (or containing) an already chosen key."""
    chosen: list[str] = []
    for k in ranked:
        if len(chosen) >= n:
            break
        padded = f" {k} "
        if any(padded in f" {c} " or f" {c} " in padded for c in chosen):
            continue
        chosen.append(k)
    return chosen


def score_doc(cands: list[list[str]], banned: set[str]) -> tuple[dict[str, float], dict[str, str]]:
    """RAKE score and first surface form of every candidate key of one document, candidates
    holding a ``banned`` (lowercase) word left out."""
    kept, lows = [], []
    for c in cands:
        low = [_norm(w) for w in c]
        if banned and not banned.isdisjoint(low):
            continue
        kept.append(c)
        lows.append(low)
    return _rake_scores(kept, lows)


def candidate_words(cands: list[list[str]]) -> set[str]:
    """The lowercase words of ``cands`` (what a ban is checked against)."""
    return {_norm(w) for c in cands for w in c}


def rank(per_doc: list[tuple[dict[str, float], dict[str, str]]], n: int) -> list[list[str]]:
    """Top ``n`` keyphrases (surface forms) of every document from its :func:`score_doc`
    output, each key weighted by its IDF over the documents passed in."""
    df: Counter[str] = Counter()
    for scores, _ in per_doc:
        df.update(scores.keys())
    n_docs = len(per_doc)
    out = []
    for scores, surface in per_doc:
        weighted = {k: s * (math.log((n_docs + 1) / (df[k] + 1)) + 1.0) for k, s in scores.items()}
        ranked = sorted(weighted, key=lambda k: (-weighted[k], k))
        out.append([surface[k] for k in _select(ranked, n)])
    return out


def key_ranks(keys: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, int]:
    """Per entry of ``keys``: the rank of its key among the distinct keys in UTF-8 byte order
    (the order of Python's ``str``), and the number of distinct keys."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks else pa.array([], keys.type)
    enc = pc.dictionary_encode(keys)
    order = pc.sort_indices(enc.dictionary).to_numpy(zero_copy_only=False)
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size, dtype=np.int64)
    return rank[enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)], int(order.size)


def idf_weights(code: np.ndarray, n_keys: int, scores: np.ndarray, n_docs: int) -> np.ndarray:
    """Each entry's score times its key's IDF over ``n_docs`` documents (a key's document frequency
    is its number of entries): the IDF per distinct frequency with :func:`math.log`, as
    :func:`rank` computes it, and the products the same IEEE doubles."""
    df = np.bincount(code, minlength=n_keys)
    table = np.zeros(int(df.max()) + 1 if df.size else 1, dtype=np.float64)
    for c in np.unique(df).tolist():
        table[c] = math.log((n_docs + 1) / (c + 1)) + 1.0
    return np.asarray(scores, dtype=np.float64) * table[df][code]


def rank_flat(doc: np.ndarray, keys: pa.Array | pa.ChunkedArray, scores: np.ndarray,
              surfaces: pa.Array | pa.ChunkedArray, n_docs: int, n: int) -> list[list[str]]:
    """:func:`rank` over the documents' scores given flat, one entry per (document, key): ``doc``
    the document's index (0 .. ``n_docs`` - 1), each key once per document. The same output as
    :func:`rank`, without making Python objects of every key: the weights in numpy
    (:func:`idf_weights`), one sort by (document, weight descending, key), and only each
    document's first keys are read."""
    doc = np.asarray(doc, dtype=np.int64)
    code, n_keys = key_ranks(keys)
    return select_ranked(doc, code, idf_weights(code, n_keys, scores, n_docs), (keys, surfaces), n_docs, n)


def select_ranked(doc: np.ndarray, code: np.ndarray, weight: np.ndarray,
                  texts: tuple[pa.Array | pa.ChunkedArray, pa.Array | pa.ChunkedArray], n_docs: int,
                  n: int) -> list[list[str]]:
    """Each document's top ``n`` surfaces (:func:`_select`) by (``weight`` descending, key
    rank ``code``); ``texts``: the entries' keys and surfaces."""
    keys, surfaces = texts
    out: list[list[str]] = [[] for _ in range(n_docs)]
    if doc.size == 0:
        return out
    order = np.lexsort((code, -weight, doc))
    d = doc[order]
    starts = np.flatnonzero(np.r_[True, d[1:] != d[:-1]])
    sizes = np.diff(np.r_[starts, d.size])
    within = np.arange(d.size) - np.repeat(starts, sizes)
    head = max(4 * n, 16)  # the first keys of a document; all of them when these do not give n phrases
    top = order[within < head]
    take = pa.array(top, pa.int64())
    top_keys, top_surfaces = keys.take(take).to_pylist(), surfaces.take(take).to_pylist()
    at = 0
    for start, size in zip(starts.tolist(), sizes.tolist()):
        m = min(size, head)
        ranked, surface = top_keys[at:at + m], top_surfaces[at:at + m]
        at += m
        chosen = _select(ranked, n)
        if len(chosen) < n and size > m:
            rows = pa.array(order[start:start + size], pa.int64())
            ranked, surface = keys.take(rows).to_pylist(), surfaces.take(rows).to_pylist()
            chosen = _select(ranked, n)
        pos = {k: i for i, k in enumerate(ranked)}
        out[int(d[start])] = [surface[pos[k]] for k in chosen]
    return out


def keyphrases(texts: list[str], n: int, exclude: set[str] | None = None) -> list[list[str]]:
    """Top ``n`` keyphrases of every text (surface forms), IDF computed over ``texts``.

    ``exclude`` holds lowercase words (e.g. speaker names) that may not appear in a phrase.
    """
    banned = {w.lower() for w in (exclude or set())}
    return rank([score_doc(candidates(text), banned) for text in texts], n)
