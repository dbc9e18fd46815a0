"""A tenant's previous build reused by a run that only appended turns (memlib.compose.reuse):
SIMILAR edges scored only for pairs with an added turn, node vectors copied when nothing they
pool from changed; in every case the output equals a build from scratch, to the bit."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from memlib.compose.published_parts import PublishedParts
from memlib.compose.reuse import PreviousTenant, appended_turns
from memlib.compose.span_pool import SpanPooler, span_pooled_vectors
from memlib.text.clues import EarlierEdges, exact_cosines, similar_edges, similar_edges_changed


def _clustered(n: int, seed: int = 0, dim: int = 384) -> np.ndarray:
    """Unit vectors in tight clusters, so many pairs are above a 0.85 threshold and ties of rank occur."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((max(2, n // 10), dim)).astype(np.float32)
    v = centers[rng.integers(0, len(centers), n)] + 0.35 * rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _edge_set(t: pa.Table) -> list[tuple]:
    return sorted(zip(t.column("src").to_pylist(), t.column("dst").to_pylist(), t.column("weight").to_pylist()))


def test_a_cosine_depends_on_its_two_vectors_only():
    """float32 matrix products round differently with the operands' shape; the per-pair cosine
    does not: the same value in any product, in both orders, and within 1e-6 of the product."""
    v = _clustered(600, seed=3)
    rng = np.random.default_rng(4)
    i, j = rng.integers(0, 600, 2000), rng.integers(0, 600, 2000)
    s = exact_cosines(v, i, j)
    assert np.array_equal(s, exact_cosines(v, j, i))
    rows = np.unique(np.concatenate([i, j]))
    sub = v[rows]
    where = {r: k for k, r in enumerate(rows)}
    assert np.array_equal(s, exact_cosines(sub, np.array([where[a] for a in i]), np.array([where[b] for b in j])))
    assert np.abs(s - np.einsum("ij,ij->i", v[i], v[j])).max() < 1e-6


@pytest.mark.parametrize("n_added, n_removed, seed", [(0, 0, 1), (1, 0, 2), (2, 0, 3), (17, 0, 4), (250, 0, 5),
                                                      (0, 1, 6), (0, 40, 7), (3, 2, 8), (120, 90, 9)])
def test_similar_edges_after_added_and_removed_turns_equal_the_full_edges(n_added, n_removed, seed):
    """The published edges of the nodes before (the removed ones in, the added ones not), and what
    changed: the same edges as scored from scratch over the nodes now."""
    n = 1500
    v = _clustered(n, seed)
    ids = [f"turn:{i:05d}" for i in range(n)]
    rng = np.random.default_rng(seed)
    changed = rng.choice(n, n_added + n_removed, replace=False)  # anywhere in the order
    added, removed = np.sort(changed[:n_added]), np.sort(changed[n_added:])
    before_rows = np.setdiff1d(np.arange(n), added)
    before = similar_edges([ids[i] for i in before_rows], ["t"] * before_rows.size, v[before_rows], 0.85)
    now = np.setdiff1d(np.arange(n), removed)
    full = similar_edges([ids[i] for i in now], ["t"] * now.size, v[now], 0.85)
    assert full.num_rows > n // 2  # enough pairs above the threshold for the top-5 cut to matter
    gone = {ids[i] for i in removed}
    if n_removed:  # some removed turns were among the published neighbours
        assert pc.sum(pc.or_(pc.is_in(before.column("src"), pa.array(list(gone))),
                             pc.is_in(before.column("dst"), pa.array(list(gone))))).as_py() > 0
    at = {r: k for k, r in enumerate(now)}
    got = similar_edges_changed([ids[i] for i in now], "t", v[now], 0.85,
                                EarlierEdges(before, np.array([at[a] for a in added], np.int64), frozenset(gone)))
    assert _edge_set(got) == _edge_set(full)


def test_similar_edges_changed_refuses_edges_of_unknown_nodes():
    v = _clustered(50)
    before = similar_edges([f"a{i}" for i in range(50)], ["t"] * 50, v, 0.85)
    assert before.num_rows
    with pytest.raises(ValueError, match="not among the nodes"):
        similar_edges_changed([f"b{i}" for i in range(50)], "t", v, 0.85, EarlierEdges(before, np.arange(0)))


def test_pooling_a_subset_of_nodes_gives_the_same_bits(tenant_pass):
    """A derived node's pooled vector does not depend on which other nodes are pooled with it."""
    from memlib.embed.tokens_backend import content_tokenizer

    nodes, tv = tenant_pass["full"].nodes.drop_columns(["embedding"]), tenant_pass["vectors"]
    whole = span_pooled_vectors(nodes, tv, content_tokenizer())
    pooler = SpanPooler.of(nodes, tv, content_tokenizer())
    assert pooler is not None and pooler.derived.size > 100
    which = np.arange(0, pooler.derived.size, 7)
    part = np.zeros_like(whole)
    pooler.pool_into(part, which)
    rows = pooler.derived[which]
    hit = np.abs(part[rows]).sum(axis=1) > 0
    assert hit.mean() > 0.9
    assert np.array_equal(part[rows][hit], whole[rows][hit])


@pytest.fixture(scope="module")
def tenant_pass(locomo_path):
    """One LoCoMo conversation: its turns, the build of all but its last session (the published
    build), and the session outputs of every session (nodes before the tenant steps)."""
    from memlib.compose.recipe import DEFAULT_RECIPE, get_recipe
    from memlib.compose.reference import embed_turns, process_tenant
    from memlib.compose.sessions import SessionOutput, session_keys, session_local, split_sessions
    from memlib.compose.vectors import TurnEncoder, TurnVectors
    from memlib.config import MemlibConfig
    from memlib.io.readers import read_input

    cfg = MemlibConfig()
    turns = read_input(str(locomo_path), "locomo").turns
    tenant = turns.column("tenant_id")[0].as_py()
    turns = turns.filter(pc.equal(turns.column("tenant_id"), tenant))
    sessions = list(dict.fromkeys(turns.column("session_id").to_pylist()))
    encoder = TurnEncoder(cfg, threads=2)
    parts, vecs, nlp = [], [], None
    for s in split_sessions(turns):
        tv = embed_turns(s, None, cfg, encoder)
        out, nlp = session_local((s, tv.vectors, session_keys(s, "k")[0].as_py()), cfg, get_recipe(DEFAULT_RECIPE), nlp)
        parts.append(out)
        vecs.append(tv)
    return {"cfg": cfg, "turns": turns, "sessions": sessions, "encoder": encoder,
            "full": process_tenant(turns, cfg, encoder),
            "nodes": SessionOutput.concat(parts).table("nodes").drop_columns(["session_key"]),
            "vectors": TurnVectors.concat(vecs, cfg.embed.dim), "process": process_tenant}


def _without(turns: pa.Table, session: str) -> pa.Table:
    return turns.filter(pc.not_equal(turns.column("session_id"), session))


def _assert_same(a, b) -> None:
    assert a.nodes.equals(b.nodes)  # every column, vectors included
    assert a.edges.equals(b.edges)  # weights included
    assert a.segments.equals(b.segments)


@pytest.mark.parametrize("published", ["all", "no_sums", "no_fallbacks"])
def test_a_run_that_appended_a_session_reuses_and_equals_a_full_build(tenant_pass, published):
    """With the published node_fallbacks and token_sums tables (what a store has) unchanged nodes
    are copied and moved ones (an added turn holds one of their fallback ids) get their vector
    from their kept local sum and the new tenant means; without the sums every token row is
    summed again; without node_fallbacks nodes with fallback ids are pooled again. The output
    equals a full build in every case, the two tables included."""
    cfg, turns, enc, build = tenant_pass["cfg"], tenant_pass["turns"], tenant_pass["encoder"], tenant_pass["process"]
    last = tenant_pass["sessions"][-1]
    before = build(_without(turns, last), cfg, enc)
    full = tenant_pass["full"]
    assert before.fallbacks is not None and before.fallbacks.num_rows > 0
    assert before.token_sums is not None and before.token_sums.num_rows > 1000
    parts = PublishedParts.of(before.edges, None if published == "no_fallbacks" else before.fallbacks,
                              None if published == "no_sums" else before.token_sums)
    prev = PreviousTenant.of(before.nodes, parts)
    got = build(turns, cfg, enc, previous=prev)
    _assert_same(got, full)
    assert got.fallbacks.equals(full.fallbacks)
    assert got.token_sums.equals(full.token_sums)
    n_last = pc.sum(pc.equal(turns.column("session_id"), last)).as_py()
    assert got.reused["appended_only"] == 1 and got.reused["appended_turns"] == n_last
    derived = sum(n for k, n in full.counts()["nodes_by_kind"].items() if k != "turn")
    if published == "no_fallbacks":
        assert 0 < got.reused["node_vectors"] and got.reused["node_vectors_refilled"] == 0
    else:
        assert got.reused["node_vectors"] > derived // 2  # most derived nodes were copied
        assert got.reused["node_vectors_refilled"] > 10  # the added session moved some tenant means


def test_a_session_appended_in_the_middle_is_an_append(tenant_pass):
    cfg, turns, enc, build = tenant_pass["cfg"], tenant_pass["turns"], tenant_pass["encoder"], tenant_pass["process"]
    middle = tenant_pass["sessions"][len(tenant_pass["sessions"]) // 2]
    before = build(_without(turns, middle), cfg, enc)
    parts = PublishedParts.of(before.edges, before.fallbacks)
    got = build(turns, cfg, enc, previous=PreviousTenant.of(before.nodes, parts))
    assert got.reused["appended_only"] == 1
    _assert_same(got, tenant_pass["full"])
    assert got.fallbacks.equals(tenant_pass["full"].fallbacks)


def test_a_deleted_session_reuses_and_equals_a_full_build(tenant_pass):
    """A deleted session (a forgotten conversation, a session gone from the input): unchanged node
    vectors are copied, those whose fallback ids the removed turns held are refilled, and only the
    SIMILAR pairs the removed turns were in are scored again; the output equals a full build."""
    cfg, turns, enc, build = tenant_pass["cfg"], tenant_pass["turns"], tenant_pass["encoder"], tenant_pass["process"]
    published = tenant_pass["full"]
    for gone in (tenant_pass["sessions"][0], tenant_pass["sessions"][len(tenant_pass["sessions"]) // 2]):
        parts = PublishedParts.of(published.edges, published.fallbacks, published.token_sums)
        prev = PreviousTenant.of(published.nodes, parts)
        deleted = _without(turns, gone)
        got = build(deleted, cfg, enc, previous=prev)
        full = build(deleted, cfg, enc)
        _assert_same(got, full)
        assert got.fallbacks.equals(full.fallbacks) and got.token_sums.equals(full.token_sums)
        n_gone = pc.sum(pc.equal(turns.column("session_id"), gone)).as_py()
        assert got.reused["removed_turns"] == n_gone and got.reused["appended_turns"] == 0
        assert got.reused["appended_only"] == 0 and got.reused["node_vectors"] > 0
        assert got.reused["node_vectors_refilled"] > 0  # the removed turns moved some tenant means


def test_a_session_replaced_by_another_reuses_and_equals_a_full_build(tenant_pass):
    """One session gone and another added in the same run."""
    cfg, turns, enc, build = tenant_pass["cfg"], tenant_pass["turns"], tenant_pass["encoder"], tenant_pass["process"]
    first, last = tenant_pass["sessions"][0], tenant_pass["sessions"][-1]
    before = build(_without(turns, last), cfg, enc)
    prev = PreviousTenant.of(before.nodes, PublishedParts.of(before.edges, before.fallbacks, before.token_sums))
    now = _without(turns, first)
    got = build(now, cfg, enc, previous=prev)
    _assert_same(got, build(now, cfg, enc))
    assert got.reused["removed_turns"] > 0 and got.reused["appended_turns"] > 0


def test_an_edited_turn_is_not_reused(tenant_pass):
    """A published turn whose text changed: every step runs over the whole tenant; same output."""
    cfg, turns, enc, build = tenant_pass["cfg"], tenant_pass["turns"], tenant_pass["encoder"], tenant_pass["process"]
    published = tenant_pass["full"]
    prev = PreviousTenant.of(published.nodes, PublishedParts.of(published.edges, published.fallbacks))
    text = turns.column("text").to_pylist()
    text[0] = text[0] + " We moved to Porto."
    edited = turns.set_column(turns.column_names.index("text"), "text", pa.array(text, pa.string()))
    got = build(edited, cfg, enc, previous=prev)
    assert got.reused == {"appended_only": 0}
    _assert_same(got, build(edited, cfg, enc))


def test_fallback_ids_are_the_text_ids_missing_from_the_provenance_turns(tenant_pass):
    """The published node_fallbacks: per derived node (clues before their merge included), the
    ids of its text that none of its provenance turns has (hand-checked against the tokenizer and
    the turns' token ids); every clue keeps its local sum and the hash of its inputs."""
    from memlib.embed.tokens_backend import content_tokenizer

    full, tv = tenant_pass["full"], tenant_pass["vectors"]
    table = full.fallbacks
    kinds = dict(zip(full.nodes.column("node_id").to_pylist(), full.nodes.column("kind").to_pylist()))
    derived = {n for n, k in kinds.items() if k not in ("turn", "clue")}
    listed = set(table.column("node_id").to_pylist())
    assert derived <= listed
    clues = [r for r in table.to_pylist() if r["inputs"] is not None]  # the clues before their merge
    assert len(clues) == len(listed - derived) > 10 and all(r["local"] for r in clues)
    tokens = dict(zip(tv.node_ids, tv.token_ids))
    rows = {r["node_id"]: r for r in full.nodes.select(["node_id", "text", "provenance"]).to_pylist()}
    some = 0
    for node_id, ids in zip(table.column("node_id").to_pylist(), table.column("ids").to_pylist()):
        if node_id not in derived:
            continue
        row = rows[node_id]
        words = set(content_tokenizer().ids([row["text"] or ""])[0].tolist())
        have = set()
        for t in row["provenance"] or []:
            have |= set(tokens[t].tolist()) if t in tokens else set()
        assert ids == sorted(words - have), node_id
        some += bool(ids)
    assert some > 10  # names and dates written in by the extraction


def test_appended_turns_checks_text_and_vector(tenant_pass):
    nodes, tv = tenant_pass["nodes"], tenant_pass["vectors"]
    cfg, turns, enc, build = tenant_pass["cfg"], tenant_pass["turns"], tenant_pass["encoder"], tenant_pass["process"]
    last = tenant_pass["sessions"][-1]
    before = build(_without(turns, last), cfg, enc)
    prev = PreviousTenant.of(before.nodes, PublishedParts.of(before.edges))
    added = appended_turns(nodes, tv, prev)
    want = turns.filter(pc.equal(turns.column("session_id"), last)).column("node_id").to_pylist()
    assert added is not None and sorted(added) == sorted(want)
    # a published turn whose vector differs (another encoder, say) is not the same turn
    emb = before.nodes.column("embedding").combine_chunks()
    flat = emb.flatten().to_numpy(zero_copy_only=False).copy().reshape(len(emb), -1)
    row = before.nodes.column("kind").to_pylist().index("turn")
    flat[row, 0] += 1e-3
    changed = before.nodes.set_column(before.nodes.column_names.index("embedding"), "embedding",
                                      pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1]))
    assert appended_turns(nodes, tv, PreviousTenant.of(changed, PublishedParts.of(before.edges))) is None


@pytest.mark.parametrize("damage", ["similar", "fallbacks"])
def test_a_published_build_that_cannot_be_reused_is_not_reused(tenant_pass, damage):
    """Reuse only saves time: when a step raises on the published build (an edge naming a turn the
    tenant never had, a fallback entry that is not an id list), that step and the next run over
    the whole tenant, the output equals a full build and the reason is reported."""
    cfg, turns, enc, build = tenant_pass["cfg"], tenant_pass["turns"], tenant_pass["encoder"], tenant_pass["process"]
    before = build(_without(turns, tenant_pass["sessions"][-1]), cfg, enc)
    prev = PreviousTenant.of(before.nodes, PublishedParts.of(before.edges, before.fallbacks))
    if damage == "similar":
        bogus = pa.table({"src": ["turn:nowhere"], "dst": [prev.similar.column("dst")[0].as_py()],
                          "weight": pa.array([0.9], pa.float32())})
        prev.similar = pa.concat_tables([prev.similar, bogus.cast(prev.similar.schema)])
    else:
        assert prev.fallbacks
        prev.fallbacks[next(iter(prev.fallbacks))] = 7  # not an array of ids
    got = build(turns, cfg, enc, previous=prev)
    _assert_same(got, tenant_pass["full"])
    assert got.fallbacks.equals(tenant_pass["full"].fallbacks)
    assert got.reused["appended_only"] == 0
    assert got.reused["error"].startswith("ValueError" if damage == "similar" else "AttributeError")


@pytest.mark.heavy
def test_an_unreadable_published_build_still_builds_the_tenant(tmp_path):
    """The tenant actor reads the published build before its steps; when that read raises (here a
    manifest naming a Lance table that is not there) it builds without it and says why."""
    import json

    from memlib.config import MemlibConfig
    from pipelines.tenant_op import TenantOp

    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text(json.dumps({"version": "v000001", "session_build_key": "key",
                                                      "tenants": {"ana": {}}}), encoding="utf-8")
    op = TenantOp(MemlibConfig(), "turns", str(store), "key")
    previous, reason = op._previous("ana")
    assert previous is None and reason
    assert op._previous("ben") == (None, None)  # not published: nothing to reuse, nothing wrong


def test_id_sums_are_exact_whatever_the_order_and_grouping_of_the_turns():
    """The per-id sums of float16 token rows are exact: summing the turns in another order, or as
    two parts added together (a published build plus a nightly's added turns), gives the same
    integers; the means agree with float64 arithmetic and survive the table round trip."""
    from memlib.compose.span_pool import IdSums

    rng = np.random.default_rng(7)
    ids = [rng.integers(0, 40, rng.integers(1, 30)).astype(np.int32) for _ in range(60)]
    vecs = [(rng.standard_normal((i.size, 384)) * rng.choice([1e-3, 1.0, 40.0])).astype(np.float16) for i in ids]
    whole = IdSums.of(ids, vecs)
    order = rng.permutation(60)
    shuffled = IdSums.of([ids[i] for i in order], [vecs[i] for i in order])
    parts = IdSums.of(ids[:45], vecs[:45]).plus(IdSums.of(ids[45:], vecs[45:]))
    for other in (shuffled, parts, IdSums.from_table(whole.table("t"))):
        assert np.array_equal(other.ids, whole.ids) and np.array_equal(other.counts, whole.counts)
        assert np.array_equal(other.sums, whole.sums)
    flat_ids = np.concatenate(ids)
    rows = np.concatenate(vecs).astype(np.float64)
    for k in (0, 7, 39):
        want = rows[flat_ids == k].mean(axis=0)
        assert np.abs(whole.means(np.array([k]))[0] - want).max() <= 1e-6 * max(1.0, np.abs(want).max())
    assert whole.count_of(np.array([3, 99])).tolist() == [int((flat_ids == 3).sum()), 0]
    assert IdSums.empty().plus(whole).sums.tolist() == whole.sums.tolist()
    # added turns whose ids the tenant has (added in place), and with an id it has not (a union)
    for extra in ([np.array([3, 3, 39], np.int32)], [np.array([3, 55, 0], np.int32)]):
        extra_vecs = [rng.standard_normal((3, 384)).astype(np.float16)]
        both = whole.plus(IdSums.of(extra, extra_vecs))
        want = IdSums.of(ids + extra, vecs + extra_vecs)
        assert np.array_equal(both.ids, want.ids) and np.array_equal(both.counts, want.counts)
        assert np.array_equal(both.sums, want.sums)
    assert np.array_equal(whole.sums, IdSums.of(ids, vecs).sums)  # the published sums are not changed
