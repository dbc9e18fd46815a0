"""auto's first stage (memlib/retrieve/first_stage.py) and session neighbours in interleaved
frames, on the store built from the sample conversations (real encoder, real token matrices)."""
from __future__ import annotations

import numpy as np
import pytest

from memlib.embed import token_encoder, token_model
from memlib.retrieve import auto, first_stage, late, matrix_cache
from memlib.retrieve.kernels import run_search
from memlib.retrieve.registry import get_strategy
from memlib.retrieve.signals import TurnFrame, turn_frame
from tests.retrieve.conftest import retrieve_config


def _frame(session: list[int]) -> TurnFrame:
    frame = TurnFrame.__new__(TurnFrame)
    frame.session = np.asarray(session)
    frame.n_sessions = int(frame.session.max()) + 1
    return frame


def test_adjacent_reads_session_neighbours_when_conversations_interleave():
    # two conversations' sessions interleaved in the frame (session_index counts per conversation)
    frame = _frame([0, 1, 0, 1, 0])
    s = np.array([1.0, 9.0, 2.0, 8.0, 3.0])
    prev, nxt = frame.neighbours
    assert prev.tolist() == [-1, -1, 0, 1, 2] and nxt.tolist() == [2, 3, 4, -1, -1]
    # session 0 is turns 0, 2, 4: the 9 and 8 of session 1 never count as a neighbour's score
    assert frame.adjacent(s).tolist() == [2.0, 8.0, 3.0, 9.0, 2.0]
    # contiguous sessions: as before (the previous and next frame positions)
    assert _frame([0, 0, 0, 1, 1]).adjacent(np.array([1.0, 5.0, 2.0, 0.0, 4.0])).tolist() == [5.0, 2.0, 5.0, 4.0, 0.0]


def test_subset_keeps_only_neighbours_inside_the_subset():
    frame = _frame([0, 1, 0, 1, 0, 0])
    frame.ids = [f"t{i}" for i in range(6)]
    frame.times = np.zeros(6)
    frame.assistant = np.zeros(6, dtype=bool)
    frame.speaker = np.array(["ann", "bo", "ann", "bo", "cy", "ann"], dtype=object)
    sub = frame.subset(np.array([0, 2, 3, 5]))
    # turn 2's next turn (4) is not in the subset; 5 follows 4, so it has no neighbour in it
    assert sub.ids == ["t0", "t2", "t3", "t5"]
    assert sub.neighbours[0].tolist() == [-1, 0, -1, -1] and sub.neighbours[1].tolist() == [1, -1, -1, -1]
    assert sub.session.tolist() == [0, 0, 1, 0]


@pytest.fixture(scope="module")
def tenant_parts(cache):
    index = cache.get(cache.tenants()[0])
    encoder = token_encoder.get_encoder(1, token_model.DEFAULT_MODEL, None)
    matrix = matrix_cache.tenant_matrix(index, encoder, None)
    return index, encoder, matrix


@pytest.mark.ray
def test_content_ids_are_the_ids_of_the_encoded_rows(tenant_parts):
    index, encoder, matrix = tenant_parts
    texts = [index.turns[t].text for t in matrix.turn_ids[:20]] + ["word " * 400]  # one text of many windows
    encoded = encoder.encode(texts)
    assert [i.tolist() for i in encoder.content_ids(texts)] == [i.tolist() for i, _ in encoded]
    rows = auto._row_ids(index, encoder, matrix)
    assert rows is not None and rows.size == matrix.vectors.shape[0]


@pytest.mark.ray
def test_candidate_maxsim_equals_full_maxsim_on_the_turns_it_reads(tenant_parts):
    index, encoder, matrix = tenant_parts
    post = first_stage.postings_for(index, matrix, lambda: auto._row_ids(index, encoder, matrix))
    longest = max(index.turns.values(), key=lambda t: len(t.text))
    q_ids, q_vecs = encoder.encode([" ".join(longest.text.split()[:12])])[0]
    full = late.maxsim(matrix, q_ids, q_vecs)
    some = np.arange(0, matrix.n_turns, 3)
    # the same int8 products; only the float32 sum over query tokens may round differently with the
    # shape (1 ulp on an AVX-512/VNNI machine, exact on AVX2)
    assert np.allclose(first_stage.maxsim_rows(matrix, post, some, q_ids, q_vecs), full[some], rtol=1e-6, atol=1e-6)
    exact = late.maxsim(matrix, q_ids, q_vecs, exact=True)
    assert np.allclose(first_stage.maxsim_rows(matrix, post, some, q_ids, q_vecs, exact=True), exact[some], atol=1e-5)
    approx = first_stage.approximate_scores(post, matrix.idf, q_ids, q_vecs, first_stage.StageParams())
    # a turn holding a query token that is rare in the tenant is reached (its own id is its nearest centroid)
    present = [int(np.searchsorted(post.vocab, i)) for i in q_ids if i in set(post.vocab.tolist())]
    rare = [v for v in present if post.df[v] <= max(1.0, 0.05 * matrix.n_turns)]
    assert rare, "the query shares no rare token with the tenant"
    holders = post.turns[post.ptr[rare[0]]:post.ptr[rare[0] + 1]]
    assert holders.size and (approx[holders] > 0).all()
    # the best exact turn is among the first stage's best few
    assert np.argmax(full) in first_stage.select(approx, 10)


@pytest.mark.ray
def test_approximate_scores_are_their_definition_by_hand(tenant_parts):
    """Per turn: sum over query tokens of idf * the best centroid cosine among the ids the token
    reaches and the turn holds, computed here turn by turn from the postings."""
    index, encoder, matrix = tenant_parts
    post = first_stage.postings_for(index, matrix, lambda: auto._row_ids(index, encoder, matrix))
    p = first_stage.StageParams(expand=6, min_cos=0.3)
    for query in ["which book did she recommend for the trip to Paris", "adoption agencies"]:
        q_ids, q_vecs = encoder.encode([query])[0]
        sim = post.similarity(q_vecs)
        reach = first_stage.reached_ids(post, sim, p)
        assert any(r.size for r in reach) and all(r.size <= p.expand for r in reach)
        want = np.zeros(post.n_turns)
        for qi, ids in enumerate(reach):
            best = np.zeros(post.n_turns)
            for v in ids.tolist():
                held = post.turns[post.ptr[v]:post.ptr[v + 1]]
                best[held] = np.maximum(best[held], sim[qi, v])
            want += matrix.idf[q_ids[qi]] * best
        got = first_stage.approximate_scores(post, matrix.idf, q_ids, q_vecs, p, sim)
        assert np.allclose(got, want, rtol=1e-5, atol=1e-6) and (got > 0).sum() == (want > 0).sum()


@pytest.mark.ray
def test_candidate_maxsim_reads_far_rows_by_their_centroid(tenant_parts):
    index, encoder, matrix = tenant_parts
    post = first_stage.postings_for(index, matrix, lambda: auto._row_ids(index, encoder, matrix))
    q_ids, q_vecs = encoder.encode(["which book did she recommend for the trip to Paris"])[0]
    sim = post.similarity(q_vecs)
    some = np.arange(1, matrix.n_turns, 2)
    full = first_stage.maxsim_rows(matrix, post, some, q_ids, q_vecs)
    # every row near: the int8 scores; no row near: MaxSim over the rows' centroids, by hand
    assert np.array_equal(first_stage.maxsim_rows(matrix, post, some, q_ids, q_vecs, centroid_sim=sim,
                                                  exact_min_cos=-0.999), full)
    by_centroid = first_stage.maxsim_rows(matrix, post, some, q_ids, q_vecs, centroid_sim=sim, exact_min_cos=1.01)
    for pos, turn in zip(range(0, some.size, 7), some[::7]):
        lo, hi = post.bounds[turn], post.bounds[turn + 1]
        if hi > lo:
            want = matrix.idf[q_ids] @ sim[:, post.row_vocab[lo:hi]].max(axis=1)
            assert by_centroid[pos] == pytest.approx(want, rel=1e-5)
    # the default threshold: a row is read exactly (onnxruntime's int8 product) where some query
    # token is near the row's id, by the centroid elsewhere; by hand, turn by turn
    mixed = first_stage.maxsim_rows(matrix, post, some, q_ids, q_vecs, centroid_sim=sim, exact_min_cos=0.2)
    mixed_f32 = first_stage.maxsim_rows(matrix, post, some, q_ids, q_vecs, exact=True, centroid_sim=sim,
                                        exact_min_cos=0.2)
    n_mixed = 0
    for pos, turn in zip(range(0, some.size, 5), some[::5]):
        lo, hi = post.bounds[turn], post.bounds[turn + 1]
        if hi == lo:
            continue
        centroid = sim[:, post.row_vocab[lo:hi]]
        near = np.broadcast_to((centroid >= 0.2).any(axis=0), centroid.shape)
        n_mixed += bool(near.any() and not near.all())
        int8 = np.where(near, post.rows(q_vecs, np.arange(lo, hi)), centroid)
        f32 = np.where(near, (matrix.vectors[lo:hi].astype(np.float32) @ q_vecs.T).T, centroid)
        assert mixed[pos] == pytest.approx(matrix.idf[q_ids] @ int8.max(axis=1), rel=1e-6)
        assert mixed_f32[pos] == pytest.approx(matrix.idf[q_ids] @ f32.max(axis=1), rel=1e-5)
    assert n_mixed >= 3, "too few turns with both near and far pairs to test the split"
    assert np.corrcoef(mixed, full)[0, 1] > 0.95
    top = set(np.argsort(-full)[:5].tolist())
    assert len(top & set(np.argsort(-mixed)[:10].tolist())) >= 4


@pytest.mark.ray
def test_auto_with_first_stage_over_every_turn_ranks_as_without(cache):
    index = cache.get(cache.tenants()[0])
    n = len(turn_frame(index).ids)
    query = "what should I cook for the night shifts?"
    plain = run_search(index, get_strategy("auto", retrieve_config()), query, 10)
    # the stage forced on (threshold 1 turn) with every turn a candidate: the same ranking and scores
    staged = run_search(index, get_strategy("auto", retrieve_config(), first_stage_turns=1, candidates=n,
                                            assistant_candidates=n, exact_min_cos=-1.0), query, 10)
    assert [t.node_id for t in staged.turns] == [t.node_id for t in plain.turns]
    assert [r.score for r in staged.nodes] == pytest.approx([r.score for r in plain.nodes])
    # few candidates: fewer turns scored, the best turn still first when the stage reaches it (the
    # query above matches no turn well: its best is a zero-score tie the stage may not pick)
    asked = "who took over the garden beds and sends photos of the tomatoes?"
    want = run_search(index, get_strategy("auto", retrieve_config()), asked, 10).turns[0]
    few = run_search(index, get_strategy("auto", retrieve_config(), first_stage_turns=1, candidates=3,
                                         exact_min_cos=-1.0), asked, 10)
    assert few.turns[0].node_id == want.node_id
    # far rows read by their centroid (the default): the best turn stays near the top
    mixed = run_search(index, get_strategy("auto", retrieve_config(), first_stage_turns=1), asked, 10)
    assert "Franco" in want.text and mixed.turns[0].node_id == want.node_id


def test_named_participants_marks_the_sessions_of_a_named_speaker():
    frame = _frame([0, 0, 1, 1, 2, 2])
    frame.speaker = np.array(["caroline", "melanie", "user", "assistant", "jonas", "kira"], dtype=object)
    assert frame.named_participants("When did Caroline's friend move?").tolist() == [True] * 2 + [False] * 4
    assert frame.named_participants("what did KIRA and melanie say").tolist() == [True, True, False, False, True, True]
    # nobody named (a word that is no speaker's name): no turn marked
    assert not frame.named_participants("when did I buy the car?").any()


def test_named_speakers_marks_the_turns_a_named_person_speaks():
    frame = _frame([0, 0, 1, 1, 2, 2])
    frame.speaker = np.array(["caroline", "melanie", "user", "assistant", "melanie", ""], dtype=object)
    assert frame.named_speakers("What did Melanie's kids paint?").tolist() == [False, True, False, False, True, False]
    assert frame.named_speakers("did CAROLINE and melanie meet").tolist() == [True, True, False, False, True, False]
    # nobody named (a speakerless turn never matches)
    assert not frame.named_speakers("when did I buy the car?").any()
    # a subset keeps each turn's speaker
    sub = _frame([0, 0, 1, 1, 2, 2])
    sub.ids, sub.speaker = list("abcdef"), frame.speaker
    sub.times, sub.assistant = np.zeros(6), np.zeros(6, dtype=bool)
    assert sub.subset(np.array([1, 4, 5])).named_speakers("Melanie?").tolist() == [True, True, False]


@pytest.mark.ray
def test_a_tenant_scored_by_candidates_does_not_prepack_the_whole_int8_product(sample_store):
    from memlib.retrieve.tenant_cache import TenantCache

    fresh = TenantCache(sample_store, embedder=None)
    index = fresh.get(fresh.tenants()[0])
    run_search(index, get_strategy("auto", retrieve_config(), first_stage_turns=1), "what should I cook?", 10)
    encoder = token_encoder.get_encoder(1, token_model.DEFAULT_MODEL, None)
    matrix = matrix_cache.tenant_matrix(index, encoder, None)
    assert "int8" not in matrix.__dict__          # candidates only: the packed copy was never made
    run_search(index, get_strategy("auto", retrieve_config()), "what should I cook?", 10)
    assert "int8" in matrix.__dict__              # a whole-tenant MaxSim builds it on first use


def test_select_breaks_ties_at_the_cut_by_position():
    """Equal first-stage scores at the cut (copies of one session score alike) go to the first
    positions, so the choice never depends on which other turns were looked at."""
    scores = np.array([0.5, 0.9, 0.5, 0.0, 0.5, 0.9], dtype=np.float32)
    assert first_stage.select(scores, 3).tolist() == [0, 1, 5]
    assert first_stage.select(scores, 4).tolist() == [0, 1, 2, 5]
    assistant = np.array([False, False, False, True, False, True])
    # the reached non-assistant turns suffice: the same choice as over every turn
    assert first_stage.select_by_role(scores, assistant, 2, 1).tolist() == [0, 1, 5]
    assert first_stage.select_by_role(scores, assistant, 5, 1).tolist() == [0, 1, 2, 4, 5]


def test_postings_walk_equals_the_numpy_walk_bit_for_bit():
    """The compiled walk (falling cosine, first visit is the maximum, no branch on data) gives
    the float32 scores of the numpy walk it replaced (a maximum.at per query token)."""
    from memlib.retrieve import jit_kernels

    rng = np.random.default_rng(7)
    n_turns, n_vocab = 300, 80
    held = [np.unique(rng.integers(0, n_turns, rng.integers(1, 40))) for _ in range(n_vocab)]
    ptr = np.r_[0, np.cumsum([h.size for h in held])].astype(np.int64)
    turns = np.concatenate(held).astype(np.int32)
    sim = rng.uniform(-0.2, 1.0, (5, n_vocab)).astype(np.float32)
    sim[2, 10] = sim[2, 11]  # a tie between two reached ids
    reach = [rng.choice(n_vocab, k, replace=False) for k in (7, 0, 12, 3, 30)] + [np.array([10, 11])]
    sim = np.r_[sim, sim[2:3]]
    weights = rng.uniform(0.5, 4.0, len(reach)).astype(np.float32)
    want = np.zeros(n_turns, np.float32)
    for qi, ids in enumerate(reach):
        best = np.zeros(n_turns, np.float32)
        for v in ids:
            np.maximum.at(best, turns[ptr[v]:ptr[v + 1]], sim[qi, v])
        want += weights[qi] * best
    cut = np.r_[0, np.cumsum([r.size for r in reach])].astype(np.int64)
    got = jit_kernels.walk_postings(sim, np.concatenate(reach).astype(np.int64), cut, ptr, turns, weights, n_turns)
    assert got.dtype == np.float32 and np.array_equal(got, want)


def test_split_reached_is_the_role_split_of_the_positive_scores():
    from memlib.retrieve import jit_kernels

    rng = np.random.default_rng(3)
    scores = np.where(rng.random(5000) < 0.4, rng.random(5000), 0.0).astype(np.float32)
    assistant = rng.random(5000) < 0.3
    other, asst = jit_kernels.split_reached(scores, assistant)
    assert other.tolist() == np.flatnonzero((scores > 0) & ~assistant).tolist()
    assert asst.tolist() == np.flatnonzero((scores > 0) & assistant).tolist()
    assert [a.size for a in jit_kernels.split_reached(np.zeros(4, np.float32), np.zeros(4, bool))] == [0, 0]


def test_reach_scan_and_top_positions_equal_their_numpy_references():
    """The compiled reach (ids per query token) and top-n choice give the answers of numpy code
    doing the same, ties included: equal cosines at the ``expand`` cut keep the lower ids, equal scores at
    the ``n`` cut the first positions."""
    from memlib.retrieve import jit_kernels

    rng = np.random.default_rng(11)
    n_v = 400
    sim = rng.uniform(-0.3, 1.0, (6, n_v)).astype(np.float32)
    sim[1] = rng.uniform(-0.3, 0.5, n_v)
    sim[1, 50:90] = 0.8                       # 40 equal cosines across the cut of 32
    sim[2] = -0.5                             # a token that reaches nothing
    df = rng.integers(1, 200, n_v)
    df[50:90] = 10
    post = first_stage.TokenPostings(np.arange(n_v), np.r_[0, np.cumsum(df)], np.zeros(int(df.sum()), np.int32),
                                     np.zeros((n_v, 2), np.float32), 1000, np.zeros(1001, np.int64),
                                     np.zeros((0, 2), np.float32), np.zeros(0, np.int32))
    for params in (first_stage.StageParams(), first_stage.StageParams(expand=5, min_cos=0.1, max_df=0.05)):
        want = []  # the numpy code the scan replaced, with a stable sort at the cut
        for qi in range(sim.shape[0]):
            reach = np.flatnonzero(sim[qi] >= params.min_cos)
            reach = reach[post.followed(params.max_df)[reach]]
            if reach.size > params.expand:
                reach = np.sort(reach[np.argsort(-sim[qi, reach], kind="stable")[:params.expand]])
            want.append(reach.tolist())
        ids, cut = jit_kernels.reach_scan(sim, post.followed(params.max_df), np.float32(params.min_cos), params.expand)
        assert [sorted(ids[cut[q]:cut[q + 1]].tolist()) for q in range(sim.shape[0])] == want
        assert [r.tolist() for r in first_stage.reached_ids(post, sim, params)] == want
        if params.expand == 32:
            assert want[1] == list(range(50, 82))
    scores = np.round(rng.random(3000), 2).astype(np.float32)   # many equal scores
    positions = np.flatnonzero(rng.random(3000) < 0.6)
    for n in (0, 1, 64, 500, positions.size, positions.size + 3):
        want = np.sort(positions[np.lexsort((positions, -scores[positions]))[:n]])  # best score, then position
        assert jit_kernels.top_positions(scores, positions, n).tolist() == want.tolist()
