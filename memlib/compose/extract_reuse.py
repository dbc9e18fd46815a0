"""The facts and triplets steps of a run that only added or removed turns of a published tenant.

They copy the published rows whose inputs did not change and build the others
(:mod:`memlib.extract.facts_reuse`, :mod:`memlib.extract.triplets_reuse`;
docs/decisions/0035-incremental-canonicalization.md). Which sessions' drafts may have changed is
decided here, from the turn rows: a session with an added or removed turn, or a turn whose row
(text, time, speaker, order, ids) differs from its published one, is dirty. The output equals a
full build's (tests/compose/test_compose_extract_reuse.py, tests/pipeline/test_pipeline_reuse.py).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.compose.rows import filter_runs
from memlib.config import Backend
from memlib.extract.base import Extraction
from memlib.extract.prior import Prior, session_key

if TYPE_CHECKING:
    from memlib.compose.state import BuildState
    from memlib.extract.base import ExtractResult

_TURN_COLUMNS = ["node_id", "conversation_id", "session_id", "text", "time", "attributes"]


def ensure_changes(state: BuildState) -> None:
    """``state.changes`` (:func:`memlib.compose.reuse.turn_changes`), found once per tenant: by the
    first step that reuses the published build."""
    if state.changes_checked:
        return
    state.changes_checked = True
    if state.previous is not None and state.token_vectors is not None:
        from memlib.compose.reuse import turn_changes

        state.changes = state.reusing(turn_changes, state.all_nodes(), state.token_vectors, state.previous)


def prior_of(state: BuildState) -> Prior | None:
    """What the extraction steps reuse of ``state.previous``; None when it cannot be reused (no
    published build, a turn's text changed, or it lacks the rows). Found once per tenant (the facts
    and triplets steps share it): it reads only the turn rows and ``state.turns``, which those steps
    do not change."""
    ensure_changes(state)
    previous = state.previous
    if previous is None or state.changes is None or getattr(previous, "extracted", None) is None:
        return None
    if state.prior is None:
        state.prior = _prior(state, previous.extracted)
    return state.prior


def _prior(state: BuildState, rows: dict[str, pa.Table]) -> Prior:
    nodes = pa.concat_tables(state.nodes) if state.nodes else schema.empty(schema.NODES_NO_EMBEDDING)
    nodes = nodes.select(_TURN_COLUMNS + ["kind"])
    turns = filter_runs(nodes, pc.equal(nodes.column("kind"), schema.NodeKind.TURN.value))  # slices: no copy
    now = pl.from_arrow(turns.select(_TURN_COLUMNS))
    was = pl.from_arrow(rows[schema.NodeKind.TURN.value].select(_TURN_COLUMNS))
    both = now.join(was, on="node_id", how="full", suffix="_was", coalesce=False)
    same = pl.all_horizontal([pl.col(c).eq_missing(pl.col(f"{c}_was")) for c in _TURN_COLUMNS])
    changed = both.filter(~same)
    dirty = {session_key(c, s) for c, s in changed.select("conversation_id", "session_id").iter_rows()
             if c is not None or s is not None}
    dirty |= {session_key(c, s) for c, s in changed.select("conversation_id_was", "session_id_was").iter_rows()
              if c is not None or s is not None}
    key = pl.concat_str("conversation_id", "session_id", separator="\x1f")
    ours = now.filter(key.is_in(list(dirty)))
    theirs = was.filter(key.is_in(list(dirty)))
    speakers = set(state.turns.filter(pc.is_in(state.turns.column("node_id"), pa.array(ours["node_id"].to_list(),
                                                                                         pa.string())))
                   .column("speaker").drop_null().to_pylist())
    speakers |= {json.loads(a).get("speaker") for a in theirs["attributes"].to_list() if a} - {None}
    return Prior(rows, frozenset(dirty), frozenset(ours["node_id"].to_list() + theirs["node_id"].to_list()),
                 frozenset(speakers), extends=theirs.height == 0)


def finish_facts(state: BuildState, prior: Prior) -> ExtractResult:
    from memlib.extract.facts_reuse import finish_reusing

    result, copied = finish_reusing(state.drafts["fact_drafts"], state.cfg.facts.concept_merge_threshold, prior)
    state.extract_reuse["facts_rows_copied"] = copied
    return result


def finish_triplets(state: BuildState, prior: Prior) -> ExtractResult:
    from memlib.extract.base import backend_of
    from memlib.extract.triplets_reuse import fact_entities, finish_reusing

    facts = None
    if state.facts is not None and backend_of(state.cfg, Extraction.FACTS) is Backend.HEURISTIC:
        # a heuristic fact's entities attribute is its draft's entities, its provenance its turn
        drafts = pl.from_arrow(state.drafts["fact_drafts"].select(["node_id", "turn_node_id", "entities"]))
        facts = drafts.select("node_id", pl.concat_list("turn_node_id").alias("provenance"),
                              pl.col("entities").alias("names"))
    elif state.facts is not None:
        facts = fact_entities(state.facts)
    result, copied = finish_reusing(state.drafts["entity_mentions"], state.drafts["triplet_drafts"], facts,
                                    state.cfg.triplets.description_chars, prior)
    state.extract_reuse["triplets_rows_copied"] = copied
    return result

