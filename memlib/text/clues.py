"""AssoMem clues: one topic clue per session, merged across sessions, plus SIMILAR edges.

A session's clue text is ``"Speaker A & Speaker B: phrase, phrase, ..."`` built from the
keyphrases of its kept turns (all turns when the gate kept none), with IDF taken over all
sessions passed in so each clue names what is specific to its session. ``merge_clues``
unions clues of one tenant whose embeddings have cosine above delta (connected components
of the thresholded similarity graph); ``similar_edges`` adds SIMILAR edges above gamma.
"""
from __future__ import annotations

import json

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from memlib import ids, schema
from memlib.config import ClueConfig
from memlib.schema import EdgeKind, NodeKind, Source
from memlib.text.clue_merge import clue_text, merge_clues, merged_vectors  # noqa: F401 - re-exported
from memlib.text.keyphrases import candidate_words, candidates, rank_flat, score_doc
from memlib.text.similar import (  # noqa: F401 - the SIMILAR edges, re-exported where they were
    EarlierEdges,
    exact_cosines,
    normalize_rows,
    pairs_above,
    similar_edges,
    similar_edges_changed,
)
from memlib.text.structure import SESSION_KEYS, index_texts, sort_turns


def _session_docs(turns: pa.Table, segments: pa.Table | None) -> pl.DataFrame:
    """Per session: turn ids in order, speakers, and the text of its kept turns."""
    df = sort_turns(pl.from_arrow(turns).with_columns(
        pl.Series("text_idx", index_texts(turns, with_caption=True)),
        pl.Series("bare", turns.column("text"))))
    if segments is not None and segments.num_rows:
        kept = pl.from_arrow(segments.select(["kept_turn_ids"])).explode("kept_turn_ids")
        kept_ids = set(kept["kept_turn_ids"].drop_nulls().to_list())
    else:
        kept_ids = set(df["node_id"].to_list())
    df = df.with_columns(pl.col("node_id").is_in(list(kept_ids)).alias("kept"))
    return df.group_by(SESSION_KEYS, maintain_order=True).agg(
        pl.col("node_id").alias("turn_ids"),
        pl.col("session_time").first(),
        pl.col("speaker").drop_nulls().unique(maintain_order=True).alias("speakers"),
        pl.when(pl.col("kept").any())
        .then(pl.col("bare").filter(pl.col("kept")).str.join(" "))
        .otherwise(pl.col("bare").str.join(" ")).first().alias("doc"),
    )


def _banned(speakers: list[str]) -> set[str]:
    return {w.lower() for name in speakers for w in name.split()}


def clue_drafts(turns: pa.Table, segments: pa.Table | None = None) -> pa.Table:
    """Per session of ``turns``: its keyphrase candidates, RAKE-scored with its own speakers'
    names banned (:data:`memlib.schema.CLUE_DRAFTS`). Depends on the session alone, so the
    build keeps it with the session's other outputs; :func:`clues_from_drafts` ranks them."""
    docs = _session_docs(turns, segments)
    rows = []
    for doc, speakers in zip(docs["doc"].to_list(), docs["speakers"].to_list()):
        cands = candidates(doc)
        scores, surface = score_doc(cands, _banned(speakers))
        rows.append({"keys": list(scores), "surfaces": [surface[k] for k in scores],
                     "scores": list(scores.values()), "words": sorted(candidate_words(cands)),
                     "candidates": cands})
    scored = pl.DataFrame(rows, schema={"keys": pl.List(pl.String), "surfaces": pl.List(pl.String),
                                        "scores": pl.List(pl.Float64), "words": pl.List(pl.String),
                                        "candidates": pl.List(pl.List(pl.String))})
    out = pl.concat([docs.select(SESSION_KEYS + ["session_time", "turn_ids", "speakers"]), scored], how="horizontal")
    return schema.conform(out.to_arrow(), schema.CLUE_DRAFTS, name="clue_drafts")


def rescored_docs(docs: pa.Table, speakers: list[list[str]]) -> list[int]:
    """The documents scored again under the tenant's ban (every speaker's name): those with a
    candidate word banned by another session's speaker and not by their own. Only the words
    that some ban holds become Python objects."""
    banned = _banned([name for names in speakers for name in names])
    if not banned or docs.num_rows == 0:
        return []
    words = docs.column("words")
    lengths = pc.list_value_length(words).fill_null(0).to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(words)
    hit = pc.is_in(flat, pa.array(sorted(banned), pa.string())).to_numpy(zero_copy_only=False)
    doc = np.repeat(np.arange(docs.num_rows), lengths)[hit]
    hits = pc.filter(flat, pa.array(hit)).to_pylist() if hit.any() else []
    own: dict[int, set[str]] = {}
    again = set()
    for i, word in zip(doc.tolist(), hits):
        if i not in own:
            own[i] = _banned(speakers[i])
        if word not in own[i]:
            again.add(i)
    return sorted(again)


def _ranked(docs: pa.Table, speakers: list[list[str]], n: int) -> list[list[str]]:
    """Each session's top ``n`` keyphrases (:func:`memlib.text.keyphrases.rank`) under the
    tenant's ban, every speaker's name: a session's kept scores, unless one of its candidates
    holds a banned word its own ban did not have (another session's speaker), then scored
    again (:func:`rescored_docs`). Only those sessions' words and candidates become Python objects."""
    doc, keys, scores, surfaces = flat_scores(docs, speakers)
    return rank_flat(doc, keys, scores, surfaces, docs.num_rows, n)


def flat_scores(docs: pa.Table, speakers: list[list[str]]) -> tuple[np.ndarray, pa.ChunkedArray, np.ndarray,
                                                                    pa.ChunkedArray]:
    """(document, key, score, surface) per entry of the documents' scores under the tenant's ban,
    the documents scored again (:func:`rescored_docs`) last."""
    banned = _banned([name for names in speakers for name in names])
    again = {i: score_doc(docs.column("candidates")[i].as_py(), banned) for i in rescored_docs(docs, speakers)}
    lengths = pc.list_value_length(docs.column("keys")).fill_null(0).to_numpy(zero_copy_only=False)
    doc = np.repeat(np.arange(docs.num_rows), lengths)
    keys = pc.list_flatten(docs.column("keys"))
    scores = pc.list_flatten(docs.column("scores")).to_numpy(zero_copy_only=False)
    surfaces = pc.list_flatten(docs.column("surfaces"))
    if again:  # their kept entries are left out (the entries are filtered, not the table and its candidates)
        keep = ~np.isin(doc, np.fromiter(again, np.int64, len(again)))
        mask = pa.array(keep)
        doc, scores, keys, surfaces = doc[keep], scores[keep], keys.filter(mask), surfaces.filter(mask)
    if again:
        redo = list(again.items())
        doc = np.concatenate([doc, np.repeat([i for i, _ in redo], [len(s) for _, (s, _) in redo])])
        keys = _chunked(keys, [k for _, (s, _) in redo for k in s])
        scores = np.concatenate([scores, np.array([v for _, (s, _) in redo for v in s.values()], dtype=np.float64)])
        surfaces = _chunked(surfaces, [f[k] for _, (s, f) in redo for k in s])
    return doc, keys, scores, surfaces


def _chunked(values: pa.Array | pa.ChunkedArray, more: list[str]) -> pa.ChunkedArray:
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    return pa.chunked_array([*chunks, pa.array(more, pa.string())], pa.string())


def clues_from_drafts(drafts: pa.Table, segments: pa.Table | None = None,
                      cfg: ClueConfig | None = None) -> tuple[pa.Table, pa.Table]:
    """One ``clue`` node per session of ``drafts`` (session order), HAS_CLUE session->clue and
    segment->clue edges; keyphrase IDF over those sessions, every speaker's name banned."""
    cfg = cfg or ClueConfig()
    docs = drafts.select(schema.CLUE_DRAFTS.names)
    # one chunk per session in a build: combined once, for the columns the nodes and edges copy
    session_cols = docs.select(SESSION_KEYS + ["session_time", "turn_ids"]).combine_chunks()
    speakers = docs.column("speakers").to_pylist()
    phrases = _ranked(docs, speakers, cfg.keyphrases)
    keys = list(zip(*(docs.column(k).to_pylist() for k in SESSION_KEYS)))
    node_ids = [ids.make_id(NodeKind.CLUE.value, *k) for k in keys]
    session_ids = [ids.session_node_id(*k) for k in keys]
    n = docs.num_rows
    col = session_cols.column
    nodes = pa.table({
        "node_id": pa.array(node_ids, pa.string()), "tenant_id": col("tenant_id"),
        "conversation_id": col("conversation_id"), "kind": pa.array([NodeKind.CLUE.value] * n, pa.string()),
        "text": pa.array([clue_text(s, p) for s, p in zip(speakers, phrases)], pa.string()),
        "time": col("session_time"), "valid_from": col("session_time"),
        "session_id": col("session_id"), "belief": pa.array([1.0] * n, pa.float32()),
        "source": pa.array([Source.HEURISTIC.value] * n, pa.string()), "provenance": col("turn_ids"),
        "attributes": pa.array([json.dumps({"keyphrases": p, "speakers": s, "session_node_ids": [sid]})
                                for p, s, sid in zip(phrases, speakers, session_ids)], pa.string()),
    })
    edges = [_edges_of(col("tenant_id"), pa.array(session_ids, pa.string()), pa.array(node_ids, pa.string()),
                       col("turn_ids"))]
    if segments is not None and segments.num_rows:
        edges.append(_segment_edges(session_cols, node_ids, segments))
    return (schema.conform(nodes, schema.NODES_NO_EMBEDDING, name="clue_nodes"),
            schema.conform(pa.concat_tables(edges), schema.EDGES, name="clue_edges"))


def _session_key(table: pa.Table) -> pa.Array:
    """One string per row naming its session (a null part named apart from every string)."""
    return pc.binary_join_element_wise(*(table.column(k) for k in SESSION_KEYS), "\x1f",
                                       null_handling="replace", null_replacement="\x00")


def _segment_edges(docs: pa.Table, node_ids: list[str], segments: pa.Table) -> pa.Table:
    """HAS_CLUE segment->clue per segment of a session with a clue, in segment order, with the
    segment's turn ids as provenance (a session's clues in their order, when it has several)."""
    doc_keys = _session_key(docs)
    seg_keys = _session_key(segments)
    if pc.count_distinct(doc_keys).as_py() == len(doc_keys):
        at = pc.index_in(seg_keys, value_set=doc_keys)
        rows = pc.indices_nonzero(pc.is_valid(at))
        clue = pc.take(at, rows)
    else:  # a session with several clues: one edge per clue, in the clues' order
        clue_of: dict[str, list[int]] = {}
        for i, key in enumerate(pc.cast(doc_keys, pa.string()).to_pylist()):
            clue_of.setdefault(key, []).append(i)
        seg = pc.cast(seg_keys, pa.string()).to_pylist()
        pairs = [(r, c) for r, key in enumerate(seg) for c in clue_of.get(key, ())]
        rows = pa.array([r for r, _ in pairs], pa.int64())
        clue = pa.array([c for _, c in pairs], pa.int64())
    picked = segments.take(rows)
    return _edges_of(picked.column("tenant_id"), picked.column("segment_id"),
                     pa.array(node_ids, pa.string()).take(clue), picked.column("turn_ids"))


def _edges_of(tenants, src, dst, provenance) -> pa.Table:
    n = len(src)
    return pa.table({"tenant_id": tenants, "src": src, "dst": dst,
                     "kind": pa.array([EdgeKind.HAS_CLUE.value] * n, pa.string()),
                     "weight": pa.array(np.ones(n, dtype=np.float32), pa.float32()),
                     "provenance": pc.cast(provenance, pa.list_(pa.string()))})


def session_clues(turns: pa.Table, segments: pa.Table | None = None,
                  cfg: ClueConfig | None = None) -> tuple[pa.Table, pa.Table]:
    """One ``clue`` node per session, HAS_CLUE session->clue and segment->clue edges (the drafts
    and their ranking in one call)."""
    return clues_from_drafts(clue_drafts(turns, segments), segments, cfg)
