"""``auto``: memlib's own retrieval strategy, chosen by cross-validated measurement.

Score of a turn (the z terms standardized over the tenant's turns):

    z(idf-MaxSim) + session_weight · z(session prior) + adjacent_weight · z(adjacent turn)
      - assistant_penalty · [assistant turn] + participant_weight · [a named person speaks
      in its session] + session_lead · [best turn of its session]

* idf-MaxSim: token-level late interaction over MiniLM token vectors (memlib/retrieve/late.py),
  every query token (``query_max_df`` 1.0), long turns read by windows;
* session prior: mean of the ``session_top`` best MaxSim scores of the turn's session;
* adjacent: the better MaxSim score of the turn's neighbours in the same session (found by
  session: a tenant of several conversations interleaves their sessions in turn order);
* assistant penalty: a role prior. What a user said about themselves is the memory; an
  assistant turn is long, generic and restates the user's question, and on LongMemEval such
  turns crowded the evidence out of the top 5 (a no-op where every turn is a user's, as in
  LoCoMo). A strongly matching assistant turn still ranks: all 4 single-session-assistant
  questions of longmemeval_s_dev24 keep their evidence at rank <= 5;
* named participant: a turn whose session has a speaker the query names (a query word equal
  to the first word of the speaker's name) is lifted by ``participant_weight`` standard
  deviations. Inert where every session has the same speakers (a LoCoMo conversation alone,
  LongMemEval's user/assistant) or nobody is named; in a tenant holding many people's
  conversations it keeps "When did Melanie run a charity race?" on Melanie's sessions
  (docs/decisions/0016-auto-parameters.md);
* named speaker (``speaker_term``): the turns the person the query names speaks themselves gain
  ``participant_weight`` too (a turn's text does not hold its speaker's name; LoCoMo's evidence is
  the named person's own turns), and (``speaker_gate``) the memory votes below go to those turns
  only; both only when that person speaks the best-matching turn (a question naming the wrong
  person keeps its ranking, docs/decisions/0037-named-speaker-turns.md);
* session lead: the best-scored turn of each session is lifted (applied last), so the top
  ranks cover more sessions;
* first stage: on a tenant of more than ``first_stage_turns`` turns only candidates are
  scored (memlib/retrieve/first_stage.py): the ``candidates`` best non-assistant turns and
  ``assistant_candidates`` best assistant turns of an approximate MaxSim over token postings,
  plus their non-assistant session neighbours; the z terms are then taken over those turns.
  Their rows go through the int8 kernel where some query token's nearest centroid cosine with
  the row's token id reaches ``exact_min_cos`` (0.2); the other rows, most of them, count with
  that centroid cosine (memlib/retrieve/first_stage.py ``maxsim_rows``). The stage's loops are
  compiled with numba (memlib/retrieve/jit_kernels.py).
  Smaller tenants (every LoCoMo conversation, every LongMemEval-S haystack) score every turn;
* ``graph_weight`` (off by default) adds GAAMA-style PPR mass from the top turns when the
  tenant has a graph; without a graph the term is skipped (clean fallback).

Then the memory the build made (memlib/retrieve/memory.py, docs/decisions/0032-auto-reads-memory.md):
each signal adds a reciprocal-rank bonus, ``w · k / (k + rank of the turn by the signal)`` over
the turns it gives a positive value (``rank_k`` 20; the signal's top turn gains w standard
deviations):

* ``fact_vote`` (``memory_weight`` 1.5): the best cosine between the question's vector and a fact
  citing the turn (the question's vector pooled from the token vectors already encoded);
* ``ppr`` (``memory_weight``): GAAMA personalized PageRank over the tenant graph, seeded by the
  ``ppr_seeds`` (10) facts and events nearest the question (cos²); it reaches turns the question
  does not name, through entities, concepts, sessions and neighbouring turns. On a graph of more
  than ``ppr_max_nodes`` vertices it is computed by forward push to a residual of the PPR's
  tolerance per unit of degree (memlib/retrieve/push.py), whose work does not grow with the graph;
* both read only the memories citing a turn of the scored turns' sessions (every turn, or the first
  stage's candidates): the others vote for no scored turn and seed no PPR
  (docs/decisions/0039-local-memory-signals.md);
* ``time_window`` (``time_weight`` 4): the turns whose session time falls in a window of the
  question's temporal expressions ("two months ago", "last Wednesday", "in May 2023"), resolved
  against the question's time (``question_time``; the evaluation passes LongMemEval's question
  date) or, without one, the tenant's latest turn time, or that an event or fact dated inside it
  cites (``event_window``: "last Wednesday I went hiking", said a week later); ranked among
  themselves by their score;
* ``mention_vote_<i>`` (``memory_weight``): an order or duration question ("which did I do first, X
  or Y?", "how many days passed between X and Y?") votes once per event it names, as the fact votes
  do, so each event reaches its own turn; and every returned turn cited by a dated event carries that
  event's date (``event_time``, ``event_span_days``), which the contexts print next to its session
  date (memlib/retrieve/event_time.py, docs/decisions/0042-event-times.md).

``memory_signals`` lists the signals (also ``event``, ``entity``, ``clue``, ``reflection``,
``triplet``, ``concept`` votes: measured and not kept, decision 0032); ``memory_weight`` and
``time_weight`` 0 give the turn ranking alone.

Token matrices are cached per tenant in memory and, with ``disk_cache`` (default), under
``cache_dir`` (default ``<store>/cache/late``) so a restarted server does not re-encode.

Selection protocol (docs/evaluation.md, "Tuning protocol"): ``memlib tune`` over locomo_dev3 and
longmemeval_s_dev24 together, three folds of whole conversations / haystacks, one
configuration for both datasets; the cross-validated figures are in docs/evaluation.md
("Cross-validated"), not copied here. The defaults are the grid's best on all questions
(the session lead grid, docs/decisions/0016-auto-parameters.md): session_weight 0.5,
adjacent_weight 0.3, assistant_penalty 4, session_lead 1, query_max_df 1.0 (dropping frequent
query tokens, 0.15 before, was never chosen), idf on (always chosen); the memory grid
(decision 0032): memory_weight 1.5, time_weight 4, rank_k 20. Tried and dropped (not chosen, or
no cross-validated gain): token-count normalisation, scoring a long turn by its best chunk of
tokens, the session read as one MaxSim document, fact text appended to its turn's MaxSim keys
(fact-augmented keys), dense turn vectors fused in, a cap on turns per session, a plain
reciprocal-rank fusion of the turn ranking with the memory signals (decision 0032).

Cost: the int8 encoder (``encoder``, a dynamically quantized MiniLM, windowed) and int8
MaxSim (``int8_maxsim``) keep a query at a few ms of CPU; figures in
docs/decisions/0005-int8-token-matrices.md.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from memlib.embed import token_encoder, token_model
from memlib.retrieve import first_stage, kernels, late, matrix_cache
from memlib.retrieve.base import RetrievedNode, StrategyBase
from memlib.retrieve.event_time import event_dates, mention_masks
from memlib.retrieve.memory import fuse_memory, memory_frame, query_vector
from memlib.retrieve.registry import register
from memlib.retrieve.signals import turn_frame, zscore


def _encoder(p: dict[str, Any], model_cache: str | None):
    return token_encoder.get_encoder(p.get("threads"), p.get("encoder", token_model.DEFAULT_MODEL), model_cache)


def _query(index, query: str, p: dict[str, Any], model_cache: str | None):
    encoder = _encoder(p, model_cache)
    cache_dir = p.get("cache_dir") or (matrix_cache.default_cache_dir(index) if p.get("disk_cache", True) else None)
    limit = int(p.get("first_stage_turns", 0))
    # the query first: on a cold tenant, joining its matrix pushes the encoder's weights out of the
    # CPU's caches, and the kernel then reads the matrix just written
    encoded = encoder.encode_query(query)
    matrix = matrix_cache.tenant_matrix(index, encoder, cache_dir, prepack_max_turns=limit if limit > 0 else None)
    q_ids, q_vecs = late.content_query_tokens(matrix, *encoded, float(p.get("query_max_df", 1.0)))
    return encoder, matrix, q_ids, q_vecs


def late_scores(index, query: str, p: dict[str, Any], model_cache: str | None = None) -> np.ndarray:
    """idf-weighted MaxSim of ``query`` against every turn (conversation order)."""
    _, matrix, q_ids, q_vecs = _query(index, query, p, model_cache)
    return late.maxsim(matrix, q_ids, q_vecs, bool(p.get("idf", True)), exact=not p.get("int8_maxsim", True)
                       ).astype(np.float64)


def _row_ids(index, encoder, matrix) -> np.ndarray | None:
    """Token id of every row of ``matrix`` (None when the texts do not give its rows back)."""
    texts = [index.texts[index.row_of[t]] if t in index.row_of else index.turns[t].text for t in matrix.turn_ids]
    ids = encoder.content_ids(texts)
    counts = np.bincount(matrix.owner, minlength=matrix.n_turns) if matrix.owner.size else np.zeros(0, np.int64)
    if len(ids) != matrix.n_turns or any(len(i) != c for i, c in zip(ids, counts)):
        return None
    return np.concatenate(ids) if ids else np.zeros(0, np.int64)


def scored_turns(index, frame, query: str, p: dict[str, Any], model_cache: str | None = None
                 ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]:
    """(positions scored, their idf-MaxSim, the query's token vectors, their token ids): every turn (positions
    None) on a tenant of at most ``first_stage_turns`` turns, else the first stage's candidates and their neighbours in
    their sessions that are not assistant turns (memlib/retrieve/first_stage.py); the other
    turns are not ranked."""
    encoder, matrix, q_ids, q_vecs = _query(index, query, p, model_cache)
    limit = int(p.get("first_stage_turns", 0))
    post = (first_stage.postings_for(index, matrix, lambda: _row_ids(index, encoder, matrix))
            if 0 < limit < matrix.n_turns else None)
    if post is None:
        return None, late.maxsim(matrix, q_ids, q_vecs, bool(p.get("idf", True)),
                                 exact=not p.get("int8_maxsim", True)).astype(np.float64), q_vecs, q_ids
    stage = first_stage.StageParams(int(p["candidates"]), int(p["assistant_candidates"]), int(p["expand"]),
                                    float(p["min_cos"]), float(p["stage_max_df"]))
    sim = post.similarity(q_vecs) if q_ids.size else None
    approx = first_stage.approximate_scores(post, matrix.idf, q_ids, q_vecs, stage, sim)
    cand = first_stage.select_by_role(approx, frame.assistant, stage.candidates, stage.assistant_candidates,
                                      frame.by_role)
    near = _neighbours(frame, cand)
    pool = np.unique(np.r_[cand, near[~frame.assistant[near]]])
    scores = first_stage.maxsim_rows(matrix, post, pool, q_ids, q_vecs, bool(p.get("idf", True)),
                                     exact=not p.get("int8_maxsim", True), centroid_sim=sim,
                                     exact_min_cos=float(p.get("exact_min_cos", -1.0)))
    return pool, scores.astype(np.float64), q_vecs, q_ids


def _neighbours(frame, cand: np.ndarray) -> np.ndarray:
    """The previous and next turn of each candidate within its session."""
    both = np.r_[frame.neighbours[0][cand], frame.neighbours[1][cand]]
    return both[both >= 0]


def graph_term(index, frame, base: np.ndarray, seeds: int) -> np.ndarray | None:
    """GAAMA PPR mass on turns seeded by the ``seeds`` best turns, or None without a graph."""
    from memlib.retrieve.graphview import graph_view

    view = graph_view(index)
    if view is None:
        return None
    top = np.argsort(-base, kind="stable")[:seeds]
    ppr = view.gaama_ppr({frame.ids[i]: float(max(base[i], 0.0)) ** 2 + 1e-9 for i in top})
    verts = view.graph.vertices(frame.ids)
    return np.where(verts >= 0, ppr[np.maximum(verts, 0)], 0.0)


def event_signals(dates: dict[int, tuple[float, float]], position: int) -> dict[str, float]:
    """``event_time`` and ``event_span_days`` of the turn at ``position`` when a dated event cites it."""
    if position not in dates:
        return {}
    when, span = dates[position]
    return {"event_time": when, "event_span_days": span}


@register("auto")
class Auto(StrategyBase):
    defaults = {"session_top": 2, "session_weight": 0.5, "adjacent_weight": 0.3, "idf": True,
                "assistant_penalty": 4.0, "session_lead": 1.0, "graph_weight": 0.0, "graph_seeds": 20,
                "threads": 1, "cache_dir": None, "disk_cache": True, "encoder": token_model.DEFAULT_MODEL,
                "query_max_df": 1.0, "int8_maxsim": True, "first_stage_turns": 4000, "candidates": 64,
                "assistant_candidates": 8, "expand": 32, "min_cos": 0.4, "stage_max_df": 0.2,
                "exact_min_cos": 0.2,
                "participant_weight": 1.0, "speaker_term": True, "speaker_gate": True,
                "memory_weight": 1.5, "time_weight": 4.0, "rank_k": 20.0,
                "memory_signals": ["fact", "ppr", "time"], "ppr_kinds": ["fact", "event"], "ppr_seeds": 10,
                "ppr_max_nodes": 20000, "question_time": None}

    wants_config = True  # for embed.model_cache

    def __init__(self, params: dict[str, Any] | None = None, cfg: Any | None = None):
        super().__init__(params)
        self.model_cache = cfg.embed.model_cache if cfg is not None else None

    def prefetch(self, query: str) -> None:
        """Encode ``query`` ahead of its search (a service does while a cold tenant opens)."""
        _encoder(self.params, self.model_cache).encode_ahead(query)

    def search(self, tenant, query: str, k: int, **params: Any) -> list[RetrievedNode]:
        p = self.call_params(params)
        frame = turn_frame(tenant)
        if not frame.ids or k <= 0:
            return []
        pool, ms, q_vecs, q_ids = scored_turns(tenant, frame, query, p, self.model_cache)
        named = frame.named_participants(query) if float(p["participant_weight"]) > 0 else None
        # the turns the person the question names speaks (decision 0037): a term, and the memory
        # votes' gate
        speaks = frame.named_speakers(query) if p["speaker_term"] or p["speaker_gate"] else None
        whole = frame
        if pool is not None:
            frame, named = frame.subset(pool), None if named is None else named[pool]
            speaks = None if speaks is None else speaks[pool]
        z_ms = zscore(ms)
        prior = zscore(frame.session_prior(ms, int(p["session_top"])))
        adj = zscore(frame.adjacent(ms))
        score = z_ms + float(p["session_weight"]) * prior + float(p["adjacent_weight"]) * adj
        if float(p["assistant_penalty"]) > 0:
            score = score - float(p["assistant_penalty"]) * frame.assistant
        if named is not None:
            score = score + float(p["participant_weight"]) * named
        if speaks is not None and speaks.size and not speaks[int(np.argmax(score))]:
            # the best-matching turn is another person's: the question is about what that person did
            # (a question naming the wrong person), no term and no gate (decision 0037)
            speaks = np.zeros(speaks.size, dtype=bool)
        if speaks is not None and p["speaker_term"]:
            score = score + float(p["participant_weight"]) * speaks
        graph = None
        if float(p["graph_weight"]) > 0:
            graph = graph_term(tenant, frame, ms, int(p["graph_seeds"]))
            if graph is not None:
                score = score + float(p["graph_weight"]) * zscore(graph)
        lead = frame.session_leaders(score)
        score = score + float(p["session_lead"]) * lead
        memory: dict[str, np.ndarray] = {}
        reads_memory = float(p["memory_weight"]) > 0 or float(p["time_weight"]) > 0
        if reads_memory:
            # an order or duration question: each event it names votes on its own (decision 0042)
            mentions = mention_masks(_encoder(p, self.model_cache), query, q_ids)
            score, memory = fuse_memory(tenant, whole, pool, score, q_vecs, query, p,
                                        only=speaks if p["speaker_gate"] else None, mentions=mentions)
        top = np.argsort(-score, kind="stable")[:k]
        # the resolved date of the event each returned turn tells of (decision 0042)
        dates = event_dates(tenant, memory_frame(tenant, whole, ("event", "fact")), top if pool is None else pool[top],
                            query_vector(tenant, q_vecs, query)) if reads_memory else {}
        signals = {frame.ids[i]: {"maxsim": float(ms[i]), "z_maxsim": float(z_ms[i]), "session_prior": float(prior[i]),
                                  "adjacent": float(adj[i]), "assistant": bool(frame.assistant[i]),
                                  "session_lead": bool(lead[i]),
                                  **({"named_participant": bool(named[i])} if named is not None else {}),
                                  **({"named_speaker": bool(speaks[i])} if speaks is not None else {}),
                                  **({"graph": float(graph[i])} if graph is not None else {}),
                                  **{name: float(v[i]) for name, v in memory.items()},
                                  **event_signals(dates, i if pool is None else int(pool[i]))}
                   for i in top}
        return kernels.make_nodes(tenant, [(frame.ids[i], float(score[i])) for i in top], signals, score_name="auto")
