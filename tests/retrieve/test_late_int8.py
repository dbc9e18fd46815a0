"""auto's fast path: the derived int8 token encoder, int8 MaxSim, frequent query tokens.

Both int8 paths keep their int8 operands within [-64, 64] so that onnxruntime's u8s8 kernels
compute the exact integer product on every x86-64 CPU: without VNNI (AVX2, the CI machines)
they add two uint8 x int8 products in a saturating int16, which full-range int8 (+-127)
overflows. The int8 results are therefore compared with numpy's exact integer computation
of the same quantization, which holds whatever instruction set onnxruntime picks."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pytest

from memlib.embed import token_encoder, token_model
from memlib.embed.minilm_backend import model_path
from memlib.embed.quantize import WEIGHT_QMAX, derived_path, dynamic_int8
from memlib.retrieve import int8_maxsim, late, matrix_cache

TURNS = ["I adopted a kitten from the animal shelter on Saturday.",
         "We drove to the coast and watched the sunset over the ocean.",
         "My sister is getting married in June, in Lisbon.",
         "The quarterly budget report is due on Friday.",
         "I started violin lessons with a teacher from the orchestra.",
         "Our team won the regional chess tournament last spring."]


@pytest.fixture(scope="module")
def matrix():
    return late.build_token_matrix(token_encoder.get_encoder(1), [f"t{i}" for i in range(len(TURNS))], TURNS)


@pytest.mark.heavy
def test_derived_model_is_cached_and_reused(tmp_path):
    out = dynamic_int8(model_path(), "minilm", cache_dir=tmp_path)
    assert out == derived_path(model_path(), "minilm", cache_dir=tmp_path) and out.stat().st_size > 1_000_000
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary files left
    mtime = out.stat().st_mtime_ns
    assert dynamic_int8(model_path(), "minilm", cache_dir=tmp_path) == out
    assert out.stat().st_mtime_ns == mtime


@pytest.mark.heavy
def test_derived_encoder_stays_close_to_the_bundled_one():
    fast, ref = token_encoder.get_encoder(1, "minilm-int8-dynamic"), token_encoder.get_encoder(1, "minilm-int8")
    assert fast.tag != ref.tag and fast.tag.startswith("all-MiniLM-L6-v2-dynint8-")
    for (ids_a, vec_a), (ids_b, vec_b) in zip(fast.encode(TURNS), ref.encode(TURNS)):
        np.testing.assert_array_equal(ids_a, ids_b)
        cos = (vec_a * vec_b).sum(axis=1)
        # measured with 7-bit weights (docs/int8-kernels.md): min 0.980, mean 0.989 on these turns (0.945 /
        # 0.986 over 290 LoCoMo turns); full-range weights gave 0.974 / 0.989 (0.952 / 0.988)
        assert cos.min() > 0.85 and cos.mean() > 0.95


def test_int8_ranges_fit_a_saturating_int16():
    # vpmaddubsw (u8s8 without VNNI) adds two uint8 x int8 products in a saturating int16
    assert 2 * 255 * max(WEIGHT_QMAX, int8_maxsim.INT8_QMAX) <= 2 ** 15 - 1 < 2 * 255 * 127


def _matmul_integer_nodes(model):
    from onnx import numpy_helper

    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return [(node, inits) for node in model.graph.node if node.op_type == "MatMulInteger"]


@pytest.mark.heavy
def test_derived_encoder_weights_fit_the_u8s8_kernels():
    """Every MatMulInteger of the derived encoder multiplies uint8 activations by int8 weights
    within [-64, 64], and onnxruntime returns the exact integer product for them even for
    activations chosen to overflow int16 pair sums (all 255 where the weight is positive).
    With the first recipe's full-range weights (+-127) this failed on AVX2 CPUs."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(token_model.model_file(token_model.DEFAULT_MODEL)[0]))
    nodes = _matmul_integer_nodes(model)
    assert len(nodes) == 36
    for node, inits in nodes:
        w = inits[node.input[1]]
        assert w.dtype == np.int8 and np.abs(w.astype(np.int32)).max() <= WEIGHT_QMAX, node.name
        assert len(node.input) < 4 or not inits[node.input[3]].any()  # symmetric: zero points 0
    node, inits = max(nodes, key=lambda n: n[1][n[0].input[1]].size)  # an FFN matrix, 384 x 1536
    w = inits[node.input[1]]
    k, n = w.shape
    rng = np.random.default_rng(3)
    cols = rng.choice(n, size=48, replace=False)
    # per chosen column, a row with 255 wherever its weight is positive (then negative): every
    # pair of products as large as the weights allow; and uniformly random rows
    a = np.concatenate([np.where(w[:, cols].T > 0, 255, 0), np.where(w[:, cols].T < 0, 255, 0),
                        rng.integers(0, 256, size=(32, k))]).astype(np.uint8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w", "a_zero"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [None, n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(0, np.uint8), "a_zero")])
    sess = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                                  ir_version=8).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {"a": a})[0], a.astype(np.int64) @ w.astype(np.int64))


def test_unknown_encoder_is_rejected():
    with pytest.raises(ValueError, match="unknown token encoder"):
        token_model.model_file("bert-huge")


def test_int8_maxsim_matches_float(matrix):
    enc = token_encoder.get_encoder(1)
    for question in ["who adopted a cat?", "when is the wedding?", "chess competition results"]:
        q_ids, q_vecs = enc.encode([question])[0]
        fast = late.maxsim(matrix, q_ids, q_vecs)
        exact = late.maxsim(matrix, q_ids, q_vecs, exact=True)
        np.testing.assert_allclose(fast, exact, atol=0.02 * max(float(matrix.idf[q_ids].sum()), 1.0))
        assert np.argmax(fast) == np.argmax(exact)
    q_ids, q_vecs = enc.encode(["who adopted a cat?"])[0]
    assert np.argmax(late.maxsim(matrix, q_ids, q_vecs)) == 0


def _dynamic_quantize(q: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """ONNX DynamicQuantizeLinear in numpy: (uint8 codes minus zero point as int64, scale)."""
    q = q.astype(np.float32)
    lo, hi = np.float32(min(float(q.min()), 0.0)), np.float32(max(float(q.max()), 0.0))
    scale = np.float32((hi - lo) / np.float32(255))
    zero = np.clip(np.round(-lo / scale), 0, 255)
    return np.clip(np.rint(q / scale) + zero, 0, 255).astype(np.int64) - int(zero), scale


def _probe():
    """Random unit rows and queries near three of them, plus rows and a query that make every
    uint8 x int8 pair as large as the quantization allows (constant vectors: all codes 255 and
    all +-max): a saturating kernel returned 0.51 for their cosine of 1 with full-range int8."""
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(500, 384)).astype(np.float32)
    vectors[-2:] = 1.0
    vectors[-1, 1::2] = -1.0
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    q = vectors[[3, 99, 400]] + 0.1 * rng.normal(size=(3, 384)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return vectors, q


def test_int8_similarity_is_the_exact_integer_product():
    vectors, q = _probe()
    constant = vectors[-2:-1]
    scale, v8 = int8_maxsim.quantize_rows(vectors)
    assert np.abs(v8.astype(np.int32)).max() == int8_maxsim.INT8_QMAX
    assert np.all(np.abs(vectors - scale[:, None] * v8) <= scale[:, None] / 2 * (1 + 1e-6))
    sim = int8_maxsim.Int8Similarity(vectors)
    for query in (q, constant, np.concatenate([q, constant])):
        q8, q_scale = _dynamic_quantize(query)
        exact = ((q8 @ v8.astype(np.int64).T).astype(np.float32) * scale[None, :]) * q_scale
        # measured on an AVX2 box (docs/int8-kernels.md): 0 difference; with full-range rows (+-127) 0.013 on
        # the random rows, 0.33 against the sign-alternating row and 0.49 for the constant ones
        # (a cosine of 1.0 scored 0.506)
        np.testing.assert_allclose(sim(query), exact, rtol=0, atol=1e-5)


def test_int8_shared_and_prepacked_graphs_give_the_same_floats(monkeypatch):
    """A tenant's rows go through the process's shared graph (rows an input) until it is asked
    PREPACK_AFTER times; then its own graph (rows a pre-packed constant) is built in the
    background and answers from then on, with the very same floats."""
    import time

    monkeypatch.setattr(int8_maxsim, "PREPACK_MIN_ROWS", 100)
    vectors, q = _probe()
    sim = int8_maxsim.Int8Similarity(vectors)
    first = sim(q)
    for _ in range(int8_maxsim.PREPACK_AFTER):
        np.testing.assert_array_equal(sim(q), first)
    deadline = time.monotonic() + 60
    while not sim.prepacked and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sim.prepacked
    np.testing.assert_array_equal(sim(q), first)
    small = int8_maxsim.Int8Similarity(vectors[:50])
    for _ in range(2 * int8_maxsim.PREPACK_AFTER):
        small(q)
    time.sleep(0.2)
    assert not small.prepacked  # too few rows to be worth a graph of their own


def test_int8_similarity_is_close_to_the_dot_product():
    vectors, q = _probe()
    sim = int8_maxsim.Int8Similarity(vectors)(q)
    assert sim.shape == (3, 500)
    # The integer product is exact (above), so the only error is rounding q and the rows to
    # their grids: |e_q| <= q_scale (one step for the clipped maximum, half a step otherwise),
    # |e_v| <= row scale / 2, and |q.v - q^.v^| <= |e_q|_max * |v|_1 + |e_v|_max * |q^|_1.
    scale, _ = int8_maxsim.quantize_rows(vectors)
    q8, q_scale = _dynamic_quantize(q)
    q_hat = q8 * q_scale
    worst = q_scale * np.abs(vectors).sum(axis=1)[None, :] + np.abs(q_hat).sum(axis=1)[:, None] * scale[None, :] / 2
    err = np.abs(sim - q @ vectors.T)
    assert np.all(err <= worst + 1e-5)
    # Rounding errors are independent and uniform: sd^2 = (q_scale^2 |v|^2 + row_scale^2 |q^|^2) / 12.
    # Measured (docs/int8-kernels.md): max error 0.0030 (3.5 sd; worst-case bound 0.030-0.047), the same on
    # any CPU since the product is exact; full-range int8 gave 0.0018 where its product is exact
    # (VNNI) and, on AVX2, 0.0135 on the random rows and 0.33 on the sign-alternating one.
    sd = np.sqrt((q_scale ** 2 * (vectors ** 2).sum(axis=1)[None, :]
                  + (q_hat ** 2).sum(axis=1)[:, None] * scale[None, :] ** 2) / 12)
    assert np.all(err <= 6 * sd) and err.max() < 0.01
    assert list(sim.argmax(axis=1)) == [3, 99, 400]


def test_frequent_query_tokens_are_dropped(matrix):
    enc = token_encoder.get_encoder(1)
    q_ids, q_vecs = enc.encode(["the kitten"])[0]
    the = enc._tok.token_to_id("the")
    assert the in q_ids  # "the" occurs in 5 of the 6 turns: (df + 1) / N = 1.0 > 0.5
    kept_ids, kept_vecs = late.content_query_tokens(matrix, q_ids, q_vecs, max_df=0.5)
    assert the not in kept_ids and len(kept_ids) == len(kept_vecs) == len(q_ids) - 1
    # max_df >= 1 keeps everything; a query of frequent tokens only is kept whole
    assert late.content_query_tokens(matrix, q_ids, q_vecs, max_df=1.0)[0].tolist() == q_ids.tolist()
    only_the = enc.encode(["the"])[0]
    assert late.content_query_tokens(matrix, *only_the, max_df=0.5)[0].tolist() == only_the[0].tolist()


def test_one_index_keeps_one_matrix_per_encoder(sample_store, tmp_path):
    from memlib.retrieve.tenant_cache import TenantCache

    cache = TenantCache(sample_store)
    index = cache.get(cache.tenants()[0])
    fast = matrix_cache.tenant_matrix(index, token_encoder.get_encoder(1, "minilm-int8-dynamic"), tmp_path)
    ref = matrix_cache.tenant_matrix(index, token_encoder.get_encoder(1, "minilm-int8"), tmp_path)
    assert fast is not ref and not np.array_equal(fast.vectors, ref.vectors)
    assert matrix_cache.tenant_matrix(index, token_encoder.get_encoder(1, "minilm-int8-dynamic"), tmp_path) is fast
    assert len(list(tmp_path.glob("late-*.npz"))) == 1  # a tenant keeps one file: the newest encoding


@pytest.mark.heavy
def test_unwritable_model_cache_falls_back_to_tmp(tmp_path, monkeypatch):
    from memlib.embed import quantize

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should go (fails even for root)")
    monkeypatch.setattr(quantize.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    out = dynamic_int8(model_path(), "minilm", cache_dir=blocker / "models")
    assert out.parent == tmp_path / "tmp" / "memlib-models" and out.exists()


@pytest.mark.heavy
def test_auto_takes_the_model_cache_from_the_config(tmp_path):
    from memlib.config import load_config
    from memlib.retrieve.registry import get_strategy

    cfg = load_config(None, environ={"MEMLIB__EMBED__MODEL_CACHE": str(tmp_path / "models")})
    assert cfg.embed.model_cache == str(tmp_path / "models")
    assert get_strategy("auto", cfg).model_cache == str(tmp_path / "models")
    encoder = token_encoder.get_encoder(1, token_model.DEFAULT_MODEL, cfg.embed.model_cache)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [derived_path(model_path(), "all-MiniLM-L6-v2",
                                                                               tmp_path / "models").name]
    assert encoder.tag == token_encoder.get_encoder(1).tag  # same derivation, same tag: matrices stay valid


def test_tenants_too_big_for_the_int8_model_use_the_float_path(matrix, monkeypatch):
    enc = token_encoder.get_encoder(1)
    q_ids, q_vecs = enc.encode(["who adopted a cat?"])[0]
    exact = late.maxsim(matrix, q_ids, q_vecs, exact=True)
    big = late.TokenMatrix(matrix.turn_ids, matrix.owner, matrix.vectors, matrix.idf)
    monkeypatch.setattr(late, "INT8_MAX_VALUES", matrix.vectors.size - 1)
    monkeypatch.setattr(late.TokenMatrix, "int8", property(lambda self: pytest.fail("int8 path used")))
    np.testing.assert_array_equal(late.maxsim(big, q_ids, q_vecs), exact)


def test_kept_int8_rows_are_the_kernels_own_quantization(sample_store):
    """The build keeps each turn's int8 rows beside its float16 vectors; a tenant's matrix read from
    its kept sessions takes them, and its kernel gives the floats quantizing at the query gave."""
    from memlib.compose.vectors import TurnVectors
    from memlib.retrieve.tenant_cache import TenantCache

    rng = np.random.default_rng(3)
    tv = TurnVectors(["a", "b", "c"], np.zeros((3, 8), np.float32), [np.arange(n, dtype=np.int32) for n in (4, 0, 7)],
                     [rng.normal(size=(n, 384)).astype(np.float16) for n in (4, 0, 7)])
    back = TurnVectors.from_table(tv.table(["s"] * 3, ["t"] * 3, 8))
    scale, v8 = int8_maxsim.quantize_rows(np.concatenate(tv.token_vectors))
    assert np.array_equal(np.concatenate(back.token_int8), v8)
    assert np.array_equal(np.concatenate(back.token_scales), scale)
    assert [len(v) for v in back.token_int8] == [4, 0, 7]

    cache = TenantCache(sample_store)
    q = rng.normal(size=(5, 384)).astype(np.float32)
    for tenant in cache.tenants():
        m = matrix_cache.tenant_matrix(cache.get(tenant), token_encoder.get_encoder(1), None)
        assert m.int8_from == "kept"  # read from the kept sessions, int8 rows included
        np.testing.assert_array_equal(m.int8(q), int8_maxsim.Int8Similarity(m.vectors)(q))


def test_a_matrix_joined_by_runs_is_the_one_joined_turn_by_turn(sample_store):
    """A cold tenant's matrix is joined from its kept sessions run by run (a few slices per
    session); it equals the matrix made turn by turn, in the tenant's order or any other, and a
    block without int8 rows (kept before them) is read turn by turn instead."""
    import random

    from memlib.compose import kept_tokens
    from memlib.retrieve.tenant_cache import TenantCache

    cache = TenantCache(sample_store)
    rng = random.Random(0)
    for tenant in cache.tenants():
        index = cache.get(tenant)
        ref = matrix_cache._view_reference(index.reader, tenant)[0]
        store = matrix_cache._kept(index.reader.path, ref["session_build_key"], lambda k: k)
        shuffled = list(index.turn_order)
        rng.shuffle(shuffled)
        for turn_ids in (list(index.turn_order), shuffled):
            joined = kept_tokens.join(store.vector_rows(ref["sessions"], transposed=True), turn_ids)
            if turn_ids is shuffled:  # sessions cut apart: no layout of the int8 rows fits, read turn by turn
                assert joined is None
                a = matrix_cache._from_sessions(ref, turn_ids, index.reader.path)
            else:
                a = late.matrix_from_kept(turn_ids, joined)
                assert np.array_equal(joined.int8, np.concatenate(tv_quantized(store, ref)[0]))
            tv = store.read_vectors(ref["sessions"])
            order = [tv.node_ids.index(t) for t in turn_ids]
            pick = lambda items, order=order: [items[i] for i in order]  # noqa: E731
            v8, scales = tv.quantized()  # the kept blocks keep their int8 rows transposed, not per turn
            b = late.matrix_from_tokens(turn_ids, pick(tv.token_ids), pick(tv.token_vectors),
                                        quantized=(pick(v8), pick(scales)))
            assert np.array_equal(a.owner, b.owner) and np.array_equal(a.idf, b.idf)
            assert np.array_equal(a.vectors, b.vectors)
            q = np.random.default_rng(1).normal(size=(4, 384)).astype(np.float32)
            np.testing.assert_array_equal(a.int8(q), b.int8(q))
        old = [(t.drop_columns(["token_int8", "token_scales"]), rows) for t, rows in store.vector_rows(ref["sessions"])]
        assert kept_tokens.join(old, list(index.turn_order)) is None
        blocks = store.vector_rows(ref["sessions"], transposed=True)
        assert kept_tokens.join(blocks, list(index.turn_order)[:-1]) is None


def tv_quantized(store, ref):
    """The int8 rows and scales of a reference's turns, quantized from their float16 vectors."""
    return store.read_vectors(ref["sessions"]).quantized()


def test_transposed_sessions_join_into_the_kernels_layout(sample_store, tmp_path):
    """The build keeps each block's int8 rows transposed per session; a cold tenant's kernel matrix
    is its sessions' columns side by side, equal to transposing its joined rows. A block without
    them (kept before), a damaged file, or a session asked for in part falls back to transposing."""

    from memlib.compose import kept_tokens, session_store
    from memlib.retrieve.tenant_cache import TenantCache

    cache = TenantCache(sample_store)
    checked = 0
    for tenant in cache.tenants():
        index = cache.get(tenant)
        ref = matrix_cache._view_reference(index.reader, tenant)[0]
        store = matrix_cache._kept(index.reader.path, ref["session_build_key"], lambda k: k)
        turn_ids = list(index.turn_order)
        blocks = store.vector_rows(ref["sessions"], transposed=True)
        assert all(b[2] is not None for b in blocks)  # written by the build
        joined = kept_tokens.join(blocks, turn_ids)
        assert joined.int8t is not None
        np.testing.assert_array_equal(joined.int8t(), int8_maxsim.transposed(joined.int8))
        matrix = late.matrix_from_kept(turn_ids, joined)
        q = np.random.default_rng(2).normal(size=(3, 384)).astype(np.float32)
        np.testing.assert_array_equal(matrix.int8(q), int8_maxsim.Int8Similarity(matrix.vectors)(q))
        # without them, or with none of these sessions: the turns are read one by one instead
        for t8 in (None, blocks[0][2].slice(0, 0)):
            assert kept_tokens.join([(blocks[0][0], blocks[0][1], t8)] + list(blocks[1:]), turn_ids) is None
        # a block of an older version keeps its int8 rows per turn: they are transposed
        with_rows = [(session_store._with_int8_rows(b[0]), b[1], None) for b in blocks]
        alt = kept_tokens.join(with_rows, turn_ids)
        assert alt.int8t is None
        np.testing.assert_array_equal(alt.int8, joined.int8)
        np.testing.assert_array_equal(late.matrix_from_kept(turn_ids, alt).int8(q), matrix.int8(q))
        # a file cut short is not read
        path = kept_tokens.int8t_path(next((store.root / "blocks").iterdir()))
        damaged = tmp_path / tenant
        damaged.mkdir()
        kept_tokens.int8t_path(damaged).write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        assert kept_tokens.read_int8t(damaged) is None
        # a session asked for in part: its columns are not whole, so the rows are transposed
        assert kept_tokens.join(blocks, turn_ids[:-1]) is None
        checked += 1
    assert checked


def test_forgetting_rewrites_the_transposed_sessions_too(tmp_path):
    """A block rewritten without a forgotten session keeps nothing of it in its transposed rows."""
    from memlib.compose import kept_tokens
    from memlib.compose.vectors import TurnVectors

    rng = np.random.default_rng(4)
    counts = (3, 2, 4)
    tv = TurnVectors(["a", "b", "c"], np.zeros((3, 8), np.float32), [np.arange(n, dtype=np.int32) for n in counts],
                     [rng.normal(size=(n, 384)).astype(np.float16) for n in counts])
    table = tv.table(["s1", "s1", "s2"], ["t", "t", "t"], 8)
    t8 = kept_tokens.transposed_sessions(table)
    assert t8.column("session_key").to_pylist() == ["s1", "s2"] and t8.column("tokens").to_pylist() == [5, 4]
    _, v8 = int8_maxsim.quantize_rows(np.concatenate(tv.token_vectors))
    first = np.frombuffer(t8.column("int8t")[0].as_py(), np.int8).reshape(384, -1)
    np.testing.assert_array_equal(first, v8[:5].T)
    # a session whose rows are not consecutive has no transposed layout
    assert kept_tokens.transposed_sessions(tv.table(["s1", "s2", "s1"], ["t"] * 3, 8)) is None
    bdir = tmp_path / "blocks" / "b"
    bdir.mkdir(parents=True)
    kept_tokens.write_int8t(table, bdir)
    kept = kept_tokens.read_int8t(bdir)
    assert kept.column("session_key").to_pylist() == ["s1", "s2"]
    kept_tokens.write_int8t(table.filter(pa.compute.equal(table.column("session_key"), "s2")), bdir)
    assert kept_tokens.read_int8t(bdir).column("session_key").to_pylist() == ["s2"]


def test_upgrading_blocks_kept_by_older_versions_gives_what_a_build_writes(sample_store, tmp_path):
    """Blocks kept before int8 rows existed, or with per-turn int8 rows and no transposed sessions,
    are brought to the layout a build writes now by SessionStore.upgrade: transposed sessions, no
    per-turn int8 rows, every other byte the same."""
    import shutil

    from memlib.compose import kept_tokens, session_store

    src = next((sample_store / session_store.SESSIONS_SUBDIR).iterdir())
    blocks_of = lambda root: sorted((root / session_store.SESSIONS_SUBDIR / src.name / "blocks").iterdir())  # noqa: E731
    now = {b.name: (session_store._read_vectors(session_store._vectors_path(b)), kept_tokens.read_int8t(b))
           for b in blocks_of(sample_store)}
    assert all(v.column("token_int8").null_count == v.num_rows and t8 is not None for v, t8 in now.values())
    for kept_rows in (False, True):
        root = tmp_path / f"store-{kept_rows}"
        shutil.copytree(src, root / session_store.SESSIONS_SUBDIR / src.name)
        for b in blocks_of(root):  # as an older version kept them
            path = session_store._vectors_path(b)
            old = session_store._read_vectors(path)
            if kept_rows:
                old = session_store._with_int8_rows(old)
            else:
                at = old.schema.get_field_index("token_scales")
                old = old.set_column(at, old.schema.field(at), pa.nulls(old.num_rows, pa.binary()))
            session_store._write(old, path)
            kept_tokens.int8t_path(b).unlink()
        kept = session_store.SessionStore(root, src.name)
        assert kept.upgrade() == {"session_blocks_upgraded": len(now), "session_blocks_not_upgraded": 0}
        for b in blocks_of(root):
            vectors, t8 = now[b.name]
            assert session_store._read_vectors(session_store._vectors_path(b)).equals(vectors)
            assert kept_tokens.read_int8t(b).equals(t8)
        assert kept.upgrade() == {"session_blocks_upgraded": 0, "session_blocks_not_upgraded": 0}
