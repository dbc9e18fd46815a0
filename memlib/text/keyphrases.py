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
import polars as pl
import pyarrow as pa

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


def _rake_scores(cands: list[list[str]]) -> tuple[dict[str, float], dict[str, str]]:
    """Per-document RAKE score and first surface form of every candidate key."""
    freq: Counter[str] = Counter()
    degree: Counter[str] = Counter()
    for c in cands:
        for w in c:
            lw = _norm(w)
            freq[lw] += 1
            degree[lw] += len(c)
    tf: Counter[str] = Counter()
    surface: dict[str, str] = {}
    base: dict[str, float] = {}
    for c in cands:
        k = _key(c)
        tf[k] += 1
        if k not in surface:
            surface[k] = " ".join(c)
            base[k] = sum(degree[_norm(w)] / freq[_norm(w)] for w in c)
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
    return _rake_scores([c for c in cands if not any(_norm(w) in banned for w in c)])


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


def rank_flat(doc: np.ndarray, keys: pa.Array, scores: np.ndarray, surfaces: pa.Array, n_docs: int,
              n: int) -> list[list[str]]:
    """:func:`rank` over the documents' scores given flat, one entry per (document, key): ``doc``
    the document's index (0 .. ``n_docs`` - 1), each key once per document. The same output as
    :func:`rank`, without making Python objects of every key: the weights are computed in numpy
    (the IDF term per distinct document frequency with :func:`math.log`, as :func:`rank` does;
    the products are the same IEEE doubles), the sort in polars (strings compare by UTF-8
    bytes, the order of Python's ``str``), and only each document's first keys are read."""
    frame = pl.DataFrame({"doc": pl.Series(doc, dtype=pl.Int64), "key": pl.Series(keys, dtype=pl.String),
                          "surface": pl.Series(surfaces, dtype=pl.String),
                          "score": pl.Series(scores, dtype=pl.Float64)})
    df = frame.group_by("key").agg(pl.len().alias("df"))
    counts = df["df"].unique().to_list()
    idf = {c: math.log((n_docs + 1) / (c + 1)) + 1.0 for c in counts}
    df = df.with_columns(pl.col("df").replace_strict(idf, return_dtype=pl.Float64).alias("idf"))
    frame = frame.join(df.select("key", "idf"), on="key", how="left").with_columns(
        (pl.col("score") * pl.col("idf")).alias("w")).sort(["doc", "w", "key"], descending=[False, True, False])
    out: list[list[str]] = [[] for _ in range(n_docs)]
    head = max(4 * n, 16)  # the first keys of a document; all of them when these do not give n phrases
    top = frame.group_by("doc", maintain_order=True).agg(pl.col("key").head(head), pl.col("surface").head(head),
                                                         pl.len().alias("size"))
    for d, ranked, surface, size in zip(*(top[c].to_list() for c in ("doc", "key", "surface", "size"))):
        chosen = _select(ranked, n)
        if len(chosen) < n and size > len(ranked):
            full = frame.filter(pl.col("doc") == d)
            ranked, surface = full["key"].to_list(), full["surface"].to_list()
            chosen = _select(ranked, n)
        at = {k: i for i, k in enumerate(ranked)}
        out[d] = [surface[at[k]] for k in chosen]
    return out


def keyphrases(texts: list[str], n: int, exclude: set[str] | None = None) -> list[list[str]]:
    """Top ``n`` keyphrases of every text (surface forms), IDF computed over ``texts``.

    ``exclude`` holds lowercase words (e.g. speaker names) that may not appear in a phrase.
    """
    banned = {w.lower() for w in (exclude or set())}
    return rank([score_doc(candidates(text), banned) for text in texts], n)
