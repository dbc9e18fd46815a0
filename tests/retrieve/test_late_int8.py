"""auto's fast path: the derived int8 token encoder, int8 MaxSim, frequent query tokens."""
from __future__ import annotations

import numpy as np
import pytest

from memlib.embed.minilm_backend import model_path
from memlib.embed.quantize import derived_path, dynamic_int8
from memlib.retrieve import late

TURNS = ["I adopted a kitten from the animal shelter on Saturday.",
         "We drove to the coast and watched the sunset over the ocean.",
         "My sister is getting married in June, in Lisbon.",
         "The quarterly budget report is due on Friday.",
         "I started violin lessons with a teacher from the orchestra.",
         "Our team won the regional chess tournament last spring."]


@pytest.fixture(scope="module")
def matrix():
    return late.build_token_matrix(late.get_encoder(1), [f"t{i}" for i in range(len(TURNS))], TURNS)


def test_derived_model_is_cached_and_reused(tmp_path):
    out = dynamic_int8(model_path(), "minilm", cache_dir=tmp_path)
    assert out == derived_path(model_path(), "minilm", cache_dir=tmp_path) and out.stat().st_size > 1_000_000
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary files left
    mtime = out.stat().st_mtime_ns
    assert dynamic_int8(model_path(), "minilm", cache_dir=tmp_path) == out
    assert out.stat().st_mtime_ns == mtime


def test_derived_encoder_stays_close_to_the_bundled_one():
    fast, ref = late.get_encoder(1, "minilm-int8-dynamic"), late.get_encoder(1, "minilm-int8")
    assert fast.tag != ref.tag and fast.tag.startswith("all-MiniLM-L6-v2-dynint8-")
    for (ids_a, vec_a), (ids_b, vec_b) in zip(fast.encode(TURNS), ref.encode(TURNS)):
        np.testing.assert_array_equal(ids_a, ids_b)
        cos = (vec_a * vec_b).sum(axis=1)
        assert cos.min() > 0.85 and cos.mean() > 0.95


def test_unknown_encoder_is_rejected():
    with pytest.raises(ValueError, match="unknown token encoder"):
        late.model_file("bert-huge")


def test_int8_maxsim_matches_float(matrix):
    enc = late.get_encoder(1)
    for question in ["who adopted a cat?", "when is the wedding?", "chess competition results"]:
        q_ids, q_vecs = enc.encode([question])[0]
        fast = late.maxsim(matrix, q_ids, q_vecs)
        exact = late.maxsim(matrix, q_ids, q_vecs, exact=True)
        np.testing.assert_allclose(fast, exact, atol=0.02 * max(float(matrix.idf[q_ids].sum()), 1.0))
        assert np.argmax(fast) == np.argmax(exact)
    q_ids, q_vecs = enc.encode(["who adopted a cat?"])[0]
    assert np.argmax(late.maxsim(matrix, q_ids, q_vecs)) == 0


def test_int8_similarity_is_close_to_the_dot_product():
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(500, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    q = vectors[[3, 99, 400]] + 0.1 * rng.normal(size=(3, 384)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    sim = late.Int8Similarity(vectors)(q)
    assert sim.shape == (3, 500)
    np.testing.assert_allclose(sim, q @ vectors.T, atol=0.01)
    assert list(sim.argmax(axis=1)) == [3, 99, 400]


def test_frequent_query_tokens_are_dropped(matrix):
    enc = late.get_encoder(1)
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
    from memlib.retrieve.tenant import TenantCache

    cache = TenantCache(sample_store)
    index = cache.get(cache.tenants()[0])
    fast = late.tenant_matrix(index, late.get_encoder(1, "minilm-int8-dynamic"), tmp_path)
    ref = late.tenant_matrix(index, late.get_encoder(1, "minilm-int8"), tmp_path)
    assert fast is not ref and not np.array_equal(fast.vectors, ref.vectors)
    assert late.tenant_matrix(index, late.get_encoder(1, "minilm-int8-dynamic"), tmp_path) is fast
    assert len(list(tmp_path.glob("late-*.npz"))) == 1  # a tenant keeps one file: the newest encoding


def test_unwritable_model_cache_falls_back_to_tmp(tmp_path, monkeypatch):
    from memlib.embed import quantize

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should go (fails even for root)")
    monkeypatch.setattr(quantize.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    out = dynamic_int8(model_path(), "minilm", cache_dir=blocker / "models")
    assert out.parent == tmp_path / "tmp" / "memlib-models" and out.exists()


def test_auto_takes_the_model_cache_from_the_config(tmp_path):
    from memlib.config import load_config
    from memlib.retrieve.registry import get_strategy

    cfg = load_config(None, environ={"MEMLIB__EMBED__MODEL_CACHE": str(tmp_path / "models")})
    assert cfg.embed.model_cache == str(tmp_path / "models")
    assert get_strategy("auto", cfg).model_cache == str(tmp_path / "models")
    encoder = late.get_encoder(1, "minilm-int8-dynamic", cfg.embed.model_cache)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [derived_path(model_path(), "all-MiniLM-L6-v2",
                                                                               tmp_path / "models").name]
    assert encoder.tag == late.get_encoder(1).tag  # same derivation, same tag: matrices stay valid


def test_tenants_too_big_for_the_int8_model_use_the_float_path(matrix, monkeypatch):
    enc = late.get_encoder(1)
    q_ids, q_vecs = enc.encode(["who adopted a cat?"])[0]
    exact = late.maxsim(matrix, q_ids, q_vecs, exact=True)
    big = late.TokenMatrix(matrix.turn_ids, matrix.owner, matrix.vectors, matrix.idf)
    monkeypatch.setattr(late, "INT8_MAX_VALUES", matrix.vectors.size - 1)
    monkeypatch.setattr(late.TokenMatrix, "int8", property(lambda self: pytest.fail("int8 path used")))
    np.testing.assert_array_equal(late.maxsim(big, q_ids, q_vecs), exact)
