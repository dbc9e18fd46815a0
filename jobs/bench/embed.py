"""Embedder benchmark on LoCoMo: throughput and turn-level dense retrieval recall.

Protocol (the evaluation issue's): questions of categories 1-4 with at least one evidence
id that exists in the conversation (LoCoMo: one conversation per tenant); every turn indexed
as "speaker: text [image: caption]"; the question embedded as a query; cosine top-k over that
conversation's turns; recall@k = fraction of the question's (existing) evidence turns in the
top k, averaged over questions.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from memlib.config import EmbedConfig, IOConfig
from memlib.embed.base import Embedder
from memlib.embed.registry import EmbedBackend, config_for, get_embedder
from memlib.io.readers import InputFormat, read_input

CATEGORIES = (1, 2, 3, 4)
KS = (5, 10, 20)


@dataclass(frozen=True)
class RetrievalSet:
    turns: pl.DataFrame      # tenant_id, turn_id, text (indexed form)
    questions: pl.DataFrame  # tenant_id, question, category, evidence (list[str], existing ids only)


def load_locomo(path: str | Path, io_cfg: IOConfig | None = None) -> RetrievalSet:
    """Turns (as indexed) and evaluable questions of a LoCoMo JSON file, via memlib.io."""
    read = read_input(path, InputFormat.LOCOMO, io_cfg or IOConfig())
    turns = pl.from_arrow(read.turns.select(["tenant_id", "turn_id", "speaker", "text", "extras"]))
    caption = pl.col("extras").str.json_path_match("$.blip_caption")
    indexed = (pl.col("speaker").fill_null("") + ": " + pl.col("text")
               + pl.when(caption.is_not_null() & (caption != ""))
               .then(" [image: " + caption + "]").otherwise(pl.lit("")))
    turns = turns.select("tenant_id", "turn_id", indexed.alias("text"))
    questions = pl.from_arrow(read.questions.select(["tenant_id", "question", "category", "evidence"]))
    questions = questions.with_columns(pl.col("category").cast(pl.Int64, strict=False),
                                       pl.col("evidence").list.eval(pl.element().str.strip_chars()))
    return RetrievalSet(turns=turns, questions=_evaluable(questions, turns))


def _evaluable(questions: pl.DataFrame, turns: pl.DataFrame) -> pl.DataFrame:
    """Categories 1-4; evidence restricted to ids present in the turns; at least one left."""
    known = turns.select("tenant_id", pl.col("turn_id").alias("evidence"), pl.lit(True).alias("known"))
    exploded = (questions.filter(pl.col("category").is_in(CATEGORIES)).with_row_index("qid")
                .explode("evidence").join(known, on=["tenant_id", "evidence"], how="left"))
    kept = (exploded.filter(pl.col("known").fill_null(False))
            .group_by("qid", "tenant_id", "question", "category", maintain_order=True)
            .agg(pl.col("evidence")))
    return kept.drop("qid")


def recall_at_k(scores: np.ndarray, relevant: np.ndarray, ks: Sequence[int]) -> dict[int, np.ndarray]:
    """Per-question fractional recall for each k; scores and relevant are (n_q, n_docs)."""
    order = np.argsort(-scores, axis=1, kind="stable")
    hits = np.take_along_axis(relevant, order, axis=1).cumsum(axis=1)
    total = np.maximum(relevant.sum(axis=1), 1)
    return {k: hits[:, min(k, scores.shape[1]) - 1] / total for k in ks}


def evaluate_conversation(embedder: Embedder, turns: pl.DataFrame, questions: pl.DataFrame,
                          passage_vectors: np.ndarray, ks: Sequence[int]) -> dict[int, np.ndarray]:
    """Recall arrays for one conversation's questions over its own turns."""
    query_vectors = embedder.embed_queries(questions["question"].to_list())
    index = {tid: i for i, tid in enumerate(turns["turn_id"].to_list())}
    relevant = np.zeros((questions.height, turns.height), dtype=np.int64)
    rows = [(q, index[e]) for q, ev in enumerate(questions["evidence"].to_list()) for e in ev]
    qi, ti = np.array(rows, dtype=np.int64).T
    relevant[qi, ti] = 1
    return recall_at_k(query_vectors @ passage_vectors.T, relevant, ks)


def bench_embedder(embedder: Embedder, data: RetrievalSet, ks: Sequence[int] = KS) -> dict:
    """Throughput over all turns, then recall@k per question averaged over questions."""
    texts = data.turns["text"].to_list()
    start = time.perf_counter()
    vectors = embedder.embed_passages(texts)
    seconds = time.perf_counter() - start
    offsets = data.turns.with_row_index("row").group_by("tenant_id").agg(pl.col("row"))
    rows_of = dict(zip(offsets["tenant_id"].to_list(), offsets["row"].to_list()))
    per_k: dict[int, list[np.ndarray]] = {k: [] for k in ks}
    for tenant, questions in data.questions.group_by("tenant_id", maintain_order=True):
        rows = np.asarray(rows_of[tenant[0]])
        result = evaluate_conversation(embedder, data.turns[rows], questions, vectors[rows], ks)
        for k in ks:
            per_k[k].append(result[k])
    figures = {f"turn_R@{k}": round(100 * float(np.concatenate(per_k[k]).mean()), 1) for k in ks}
    return {"backend": embedder.name, "dim": embedder.dim, "turns": len(texts),
            "embed_s": round(seconds, 2), "sentences_per_s": round(len(texts) / seconds, 1), **figures}


def run_bench(path: str | Path, backends: Sequence[EmbedBackend | str], base: EmbedConfig | None = None) -> dict:
    """The JSON document printed by ``memlib bench embed``."""
    data = load_locomo(path)
    results = []
    for backend in backends:
        start = time.perf_counter()
        embedder = get_embedder(config_for(backend, base))
        load_s = round(time.perf_counter() - start, 2)
        results.append({**bench_embedder(embedder, data), "load_s": load_s})
    return {"input": str(path), "questions": data.questions.height, "turns": data.turns.height,
            "categories": list(CATEGORIES), "protocol": __doc__.split("\n\n")[1].replace("\n", " "),
            "threads": (base or EmbedConfig()).threads, "results": results}
