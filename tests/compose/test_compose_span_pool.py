"""Derived-node vectors pooled from the turns' token vectors (memlib.compose.span_pool), on hand-made
token vectors and a word tokenizer: no model."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from memlib.compose.span_pool import IdSums, span_pooled_vectors
from memlib.compose.vectors import TurnVectors

WORDS = {w: i for i, w in enumerate(["ana", "ran", "the", "race", "in", "porto", "rita", "lisbon", "kitten"], 1)}
DIM = 6


class WordTokenizer:
    """``ids`` as ContentTokenizer gives them, one id per known word (unknown words dropped)."""

    def ids(self, texts):
        return [np.array([WORDS[w] for w in t.lower().split() if w in WORDS], dtype=np.int32) for t in texts]


def _unit(v):
    v = np.asarray(v, dtype=np.float32)
    return v / np.linalg.norm(v)


def _turn(words, seed):
    """Token ids and distinct random unit vectors of a turn's words."""
    rng = np.random.default_rng(seed)
    vecs = rng.normal(size=(len(words), DIM)).astype(np.float32)
    return np.array([WORDS[w] for w in words], dtype=np.int32), vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


@pytest.fixture
def turns():
    t1 = _turn(["ana", "ran", "the", "race", "the", "porto"], 1)
    t2 = _turn(["rita", "in", "lisbon"], 2)
    t3 = _turn(["rita", "ran"], 3)
    ids, vecs = zip(t1, t2, t3)
    passage = np.stack([_unit(v.mean(axis=0)) for v in vecs])
    return TurnVectors(["t1", "t2", "t3"], passage, list(ids), list(vecs))


def _pool(turns, rows):
    nodes = pa.table({"kind": [r[0] for r in rows], "text": [r[1] for r in rows],
                      "provenance": pa.array([r[2] for r in rows], pa.list_(pa.string()))})
    return span_pooled_vectors(nodes, turns, WordTokenizer())


def _rows(turns, turn, word):
    i = turns.node_ids.index(turn)
    return turns.token_vectors[i][turns.token_ids[i] == WORDS[word]]


def test_turn_nodes_keep_their_own_vector(turns):
    out = _pool(turns, [("turn", "ana ran the race the porto", ["t1"])])
    assert np.allclose(out[0], turns.vectors[0])


def test_each_position_of_the_node_text_counts_once(turns):
    # "ana ana race": the name twice, once the word; "the" (twice in the turn) is not in the text
    out = _pool(turns, [("fact", "ana ana race", ["t1"])])
    want = _unit(2 * _rows(turns, "t1", "ana")[0] + _rows(turns, "t1", "race")[0])
    assert np.allclose(out[0], want, atol=1e-6)


def test_a_word_the_turn_repeats_is_the_mean_of_its_rows(turns):
    out = _pool(turns, [("fact", "the race", ["t1"])])
    want = _unit(_rows(turns, "t1", "the").mean(axis=0) + _rows(turns, "t1", "race")[0])
    assert np.allclose(out[0], want, atol=1e-6)


def test_a_word_not_in_the_nodes_turns_takes_its_mean_over_the_tenants_turns(turns):
    # "rita" is not in t1 (the fact's turn); it is in t2 and t3
    out = _pool(turns, [("fact", "rita ran the race", ["t1"])])
    rita = (_rows(turns, "t2", "rita")[0] + _rows(turns, "t3", "rita")[0]) / 2
    want = _unit(rita + _rows(turns, "t1", "ran")[0] + _rows(turns, "t1", "the").mean(axis=0)
                 + _rows(turns, "t1", "race")[0])
    assert np.allclose(out[0], want, atol=1e-6)


def test_several_provenance_turns_pool_their_rows_together(turns):
    out = _pool(turns, [("concept", "ran", ["t1", "t3"])])
    want = _unit((_rows(turns, "t1", "ran")[0] + _rows(turns, "t3", "ran")[0]) / 2)
    assert np.allclose(out[0], want, atol=1e-6)


def test_a_node_with_no_known_word_falls_back_to_its_turns_mean(turns):
    out = _pool(turns, [("fact", "kitten", ["t1", "t2"]), ("fact", "zebra", ["t2"])])
    assert np.allclose(out[0], _unit(turns.vectors[0] + turns.vectors[1]), atol=1e-6)
    assert np.allclose(out[1], turns.vectors[1], atol=1e-6)


def test_rows_of_many_nodes_are_pooled_independently(turns):
    rows = [("fact", "ana ran", ["t1"]), ("turn", "x", ["t2"]), ("fact", "lisbon", ["t2"]),
            ("fact", "porto porto rita", ["t1"])]
    together = _pool(turns, rows)
    for i, row in enumerate(rows):
        if row[0] != "turn":
            assert np.allclose(together[i], _pool(turns, [row])[0], atol=1e-6)


def test_the_order_of_the_turns_does_not_change_a_bit():
    # many turns hold "rita" and "ran": a fact's "rita" (not in its own turn) and a concept of
    # all the turns sum rows over many turns, which float addition makes order-sensitive
    rng = np.random.default_rng(7)
    ids, vecs = [np.array([WORDS["ana"], WORDS["race"]], dtype=np.int32)], [rng.normal(size=(2, DIM))]
    for _ in range(40):
        ids.append(np.array([WORDS["rita"], WORDS["ran"], WORDS["in"]], dtype=np.int32))
        vecs.append(rng.normal(size=(3, DIM)) * rng.uniform(0.001, 1000))
    vecs = [v.astype(np.float32) for v in vecs]
    names = [f"t{i:02d}" for i in range(len(ids))]
    passage = np.stack([_unit(v.mean(axis=0)) for v in vecs])
    rows = [("fact", "rita ran the race", ["t00"]), ("concept", "ran in", names), ("fact", "ana", ["t00"])]
    order = rng.permutation(len(ids))
    a = _pool(TurnVectors(names, passage, ids, vecs), rows)
    b = _pool(TurnVectors([names[i] for i in order], passage[order], [ids[i] for i in order],
                          [vecs[i] for i in order]), rows)
    np.testing.assert_array_equal(a, b)


def _scipy_times(weights, per_turn):
    """The product as the build computed it before the compiled loop: every token row gathered in
    float32, then scipy's CSR product (the reference the kernel must equal to the bit)."""
    dense = np.concatenate([np.asarray(v, dtype=np.float32).reshape(-1, per_turn[0].shape[1]) for v in per_turn])
    return np.asarray(weights.tocsr() @ dense)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_compiled_product_equals_scipys_to_the_bit(dtype):
    from scipy import sparse

    from memlib.compose.span_pool import TokenRows

    rng = np.random.default_rng(3)
    sizes = [4, 0, 7, 1, 30, 2, 9]
    per_turn = [(rng.normal(size=(n, 16)) * rng.uniform(0.01, 100)).astype(dtype) for n in sizes]
    ids = [rng.integers(1, 50, n).astype(np.int32) for n in sizes]
    rows = TokenRows.of(TurnVectors([f"t{i}" for i in range(len(sizes))], np.zeros((len(sizes), 16), np.float32),
                                    ids, per_turn), 64)
    n_rows = sum(sizes)
    # duplicates (the same node and row twice) are summed by scipy first, as the build's matrices are
    node = rng.integers(0, 12, 400)
    col = rng.integers(0, n_rows, 400)
    weights = sparse.csr_matrix((rng.uniform(0.01, 3, 400).astype(np.float32), (node, col)), shape=(12, n_rows))
    np.testing.assert_array_equal(rows.times(weights), _scipy_times(weights, per_turn))


def _positions_by_loop(words, provenance, turn_index):
    """Positions as a loop over nodes (the implementation the vectorized one replaced)."""
    node, ids, count, turn_row, turn = [], [], [], [], []
    n_rows = 0
    for j, (w, prov) in enumerate(zip(words, provenance)):
        u, c = np.unique(np.asarray(w, dtype=np.int64), return_counts=True)
        turns = np.fromiter((turn_index[t] for t in prov or [] if t in turn_index), dtype=np.int64)
        node.append(np.full(u.size, j, dtype=np.int64))
        ids.append(u)
        count.append(c.astype(np.float32))
        turn_row.append(np.repeat(np.arange(n_rows, n_rows + u.size, dtype=np.int64), turns.size))
        turn.append(np.tile(turns, u.size))
        n_rows += u.size
    return [np.concatenate(p) if p else np.zeros(0) for p in (node, ids, count, turn_row, turn)]


def test_positions_equal_the_loop_over_nodes():
    from memlib.compose.span_pool import Positions

    rng = np.random.default_rng(5)
    turn_index = {f"t{i}": i for i in range(8)}
    words = [rng.integers(1, 40, rng.integers(0, 12)).astype(np.int32) for _ in range(60)]
    provenance = [None if i % 17 == 0 else [f"t{k}" for k in rng.integers(0, 10, rng.integers(0, 4))]
                  for i in range(60)]  # t8, t9: turns not in the tenant, dropped
    got = Positions.of(words, provenance, turn_index)
    want = _positions_by_loop(words, provenance, turn_index)
    for name, a, b in zip(("node", "ids", "count", "turn_row", "turn"), (got.node, got.ids, got.count,
                                                                          got.turn_row, got.turn), want):
        np.testing.assert_array_equal(a, b, err_msg=name)
    empty = Positions.of([], [], turn_index)
    assert empty.node.size == empty.turn.size == 0


def test_nodes_pooled_over_the_turns_they_cite_get_the_bits_of_all_turns():
    """A nightly run pools its new nodes over the turns they cite alone
    (memlib.compose.reuse.provenance_turns), with the tenant's sums: the vectors and the fallbacks
    of pooling over every turn, with order-sensitive sums over many turns, a node whose word no
    turn of its own holds, and a node citing a turn the tenant does not have."""
    from memlib.compose.reuse import provenance_turns
    from memlib.compose.span_pool import IdSums, SpanPooler

    rng = np.random.default_rng(11)
    ids, vecs = [], []
    for _ in range(30):
        ids.append(np.array([WORDS["rita"], WORDS["ran"], WORDS["in"], WORDS["lisbon"]], dtype=np.int32))
        vecs.append((rng.normal(size=(4, DIM)) * rng.uniform(0.001, 1000)).astype(np.float32))
    names = [f"t{i:02d}" for i in rng.permutation(30)]
    tv = TurnVectors(names, np.stack([_unit(v.mean(axis=0)) for v in vecs]), ids, vecs)
    nodes = pa.table({"kind": ["fact", "concept", "fact", "entity", "fact"],
                      "text": ["rita ran in lisbon", "ran in", "kitten lisbon", "rita", "ran the race"],
                      "provenance": pa.array([["t03"], names[:20], ["t07", "t05"], ["t99"], ["t12", "t99"]],
                                             pa.list_(pa.string()))})
    sums = IdSums.of(tv.token_ids, tv.token_vectors)
    rows = np.array([0, 1, 2, 3, 4], dtype=np.int64)
    cited = provenance_turns(nodes, rows, tv)
    assert sorted(cited.node_ids) == sorted(set(names[:20]) | {"t03", "t05", "t07", "t12"})
    got, want = np.zeros((5, DIM), np.float32), np.zeros((5, DIM), np.float32)
    got_fb = SpanPooler.of(nodes, cited, WordTokenizer(), rows=rows, sums=sums).pool_into(got, np.arange(5))
    want_fb = SpanPooler.of(nodes, tv, WordTokenizer(), rows=rows, sums=sums).pool_into(want, np.arange(5))
    np.testing.assert_array_equal(got, want)
    for a, b in zip(got_fb, want_fb):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.counts, b.counts)
        assert (a.local is None) == (b.local is None)
        if a.local is not None:
            np.testing.assert_array_equal(a.local, b.local)
    assert provenance_turns(nodes, np.array([3]), tv) is tv  # it cites no turn of the tenant: all are read


def test_a_kept_node_whose_only_words_left_the_tenant_gets_its_turns_mean_as_in_a_full_build():
    """After a removal, a kept node whose every word was a fallback id held only by the removed turn
    has a zero sum: like a full build, the nightly gives it the mean of its turns' vectors
    (memlib.compose.reuse.pooled_reusing), and a node that still has words gets its pooled vector."""
    from memlib import schema
    from memlib.compose.published_parts import PublishedParts
    from memlib.compose.reuse import PreviousTenant, TurnChanges, fallbacks_table, pooled_reusing
    from memlib.compose.span_pool import span_pooled_with_fallbacks
    from memlib.compose.vectors import with_embeddings

    ids, vecs = zip(_turn(["ana", "ran", "the", "race"], 1), _turn(["rita", "in", "lisbon"], 2),
                    _turn(["kitten", "porto"], 9))
    passage = np.stack([_unit(v.mean(axis=0)) for v in vecs])

    def table(turn_names, extra):
        rows = [(n, "turn", n, [n]) for n in turn_names] + extra
        return pa.table({"tenant_id": ["x"] * len(rows), "node_id": [r[0] for r in rows],
                         "kind": [r[1] for r in rows], "text": [r[2] for r in rows],
                         "provenance": pa.array([r[3] for r in rows], pa.list_(pa.string()))})

    derived = [("f1", "fact", "kitten", ["t1"]), ("f2", "fact", "porto ana", ["t1"]),
               ("f3", "fact", "rita kitten", ["t2"])]
    before_tv = TurnVectors(["t1", "t2", "t9"], passage, list(ids), list(vecs))
    before = table(["t1", "t2", "t9"], derived)
    vectors, fallbacks, sums = span_pooled_with_fallbacks(before, before_tv, WordTokenizer())
    parts = PublishedParts.of(schema.empty(schema.EDGES), fallbacks_table(before, fallbacks), sums.table("x"))
    previous = PreviousTenant.of(with_embeddings(before, vectors, DIM), parts)
    after_tv = TurnVectors(["t1", "t2"], passage[:2], list(ids[:2]), list(vecs[:2]))
    after = table(["t1", "t2"], derived)
    got = pooled_reusing(after, after_tv, WordTokenizer(), previous, TurnChanges([], ["t9"]))
    want = span_pooled_with_fallbacks(after, after_tv, WordTokenizer())[0]
    np.testing.assert_array_equal(got.vectors, want)
    np.testing.assert_allclose(got.vectors[2], passage[0], atol=1e-6)  # f1: "kitten" is gone: its turn's mean
    assert got.refilled == 3 and got.copied == 0


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("new_ids", [[2, 5], [2, 9, 40]])
def test_sums_plus_an_append_equal_the_sums_of_every_row(new_ids, in_place):
    """IdSums.plus, with the append's ids all known to the tenant (one copy of its sums) or not (a
    union): the same exact sums as summing every row at once, and the tenant's sums unchanged."""
    rng = np.random.default_rng(3)
    old_ids = [np.array([1, 2, 5, 7], np.int64), np.array([2, 7, 11], np.int64)]
    old_rows = [rng.standard_normal((ids.size, DIM)).astype(np.float16) for ids in old_ids]
    new = np.array(new_ids, np.int64)
    new_rows = rng.standard_normal((new.size, DIM)).astype(np.float16)
    before = IdSums.of(old_ids, old_rows, DIM)
    kept = before.sums.copy()
    got = before.plus(IdSums.of([new], [new_rows], DIM), in_place=in_place)
    want = IdSums.of(old_ids + [new], old_rows + [new_rows], DIM)
    assert np.array_equal(got.ids, want.ids) and np.array_equal(got.counts, want.counts)
    assert np.array_equal(got.sums, want.sums)
    known = set(new_ids) <= {1, 2, 5, 7, 11}
    if in_place and known:  # added into the tenant's own arrays: no copy of its sums
        assert got.sums is before.sums
    else:
        assert np.array_equal(before.sums, kept)
