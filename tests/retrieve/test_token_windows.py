"""auto's token encoder reads long texts by windows (memlib/retrieve/token_windows.py)."""
from __future__ import annotations

import numpy as np
import pytest

from memlib.retrieve import late, matrix_cache, token_encoder, token_model, token_windows

SHORT = ["I adopted a kitten from the animal shelter on Saturday.",
         "We drove to the coast and watched the sunset over the ocean.",
         "", "My sister is getting married in June, in Lisbon."]
FILLER = " ".join(f"We talked about item number {i} on the grocery list and its price." for i in range(40))
NEEDLE = "My grandmother's parrot is called Captain Biscuit and speaks Portuguese."
LONG = f"{FILLER} {NEEDLE}"


@pytest.fixture(scope="module")
def encoders():
    return (token_encoder.get_encoder(1, "minilm-int8-dynamic"),
            token_encoder.get_encoder(1, "minilm-int8-dynamic-windows"))


def test_short_text_is_one_window_as_the_tokenizer_cuts_it():
    ids = list(range(100, 150))
    (w,) = token_windows.windows_of(0, ids)
    assert w.ids == ids and (w.keep_from, w.keep_to) == (1, 49)


@pytest.mark.parametrize("n,overlap", [(127, 32), (300, 32), (300, 0), (1000, 32), (2000, 16)])
def test_windows_keep_every_content_token_once_in_order(n, overlap):
    ids = [101, *range(1000, 1000 + n), 102]
    wins = token_windows.windows_of(3, ids, overlap=overlap, max_windows=100)
    kept = [tok for w in wins for tok in w.ids[w.keep_from:w.keep_to]]
    assert kept == ids[1:-1]
    assert all(len(w.ids) <= token_windows.WINDOW and w.ids[0] == 101 and w.ids[-1] == 102 and w.text == 3
               for w in wins)
    # every kept token has at least overlap/2 tokens of context on each side within its window,
    # unless it is near the text's own ends
    for i, w in enumerate(wins):
        if i > 0:
            assert w.keep_from - 1 >= overlap // 2
        if i < len(wins) - 1:
            assert (len(w.ids) - 1) - w.keep_to >= overlap - overlap // 2


def test_window_cap_reads_the_start():
    ids = [101, *range(1000, 3000), 102]
    wins = token_windows.windows_of(0, ids, overlap=32, max_windows=3)
    kept = [tok for w in wins for tok in w.ids[w.keep_from:w.keep_to]]
    assert len(wins) == 3 and kept == ids[1:1 + 126 + 2 * 94]


def test_short_texts_encode_exactly_as_before(encoders):
    old, new = encoders
    for (ids_a, vec_a), (ids_b, vec_b) in zip(old.encode(SHORT), new.encode(SHORT)):
        np.testing.assert_array_equal(ids_a, ids_b)
        np.testing.assert_array_equal(vec_a, vec_b)


def test_evidence_past_token_128_is_encoded_and_found(encoders):
    old, new = encoders
    (ids_old, _), = old.encode([LONG])
    (ids_new, vecs_new), = new.encode([LONG])
    parrot = new._tok.encode("parrot").ids[1:-1]
    assert len(ids_old) < 128 and not np.isin(parrot, ids_old).any()
    assert len(ids_new) > 400 and np.isin(parrot, ids_new).all()
    assert vecs_new.shape == (len(ids_new), 384) and np.allclose(np.linalg.norm(vecs_new, axis=1), 1, atol=1e-3)
    # the first window's tokens are the truncating encoder's tokens
    np.testing.assert_array_equal(ids_new[:len(ids_old)], ids_old)
    turns = [LONG, *SHORT[:2], "Parrots are colourful birds that live in the tropics."]
    query = "What is the name of my grandmother's parrot?"
    ranks = {}
    for name, enc in (("old", old), ("new", new)):
        m = late.build_token_matrix(enc, [f"t{i}" for i in range(len(turns))], turns)
        q_ids, q_vecs = enc.encode([query])[0]
        ranks[name] = int(np.argmax(late.maxsim(m, q_ids, q_vecs, exact=True)))
    assert ranks == {"old": 3, "new": 0}


def test_windowed_encoder_has_its_own_tag_and_cache_key(encoders):
    old, new = encoders
    assert new.tag == f"{old.tag}-{token_windows.spec()}"
    assert matrix_cache.content_key(["a"], ["x"], new.tag) != matrix_cache.content_key(["a"], ["x"], old.tag)
    assert token_model.model_file(token_model.DEFAULT_MODEL)[1] == new.tag  # what the build stores matrices under
    with pytest.raises(ValueError, match="unknown token encoder"):
        token_model.model_file("minilm-int8-dynamic-window")


class FakeSession:
    """Stands in for the ONNX session: a token's hidden state is a fixed random vector of its id
    plus its position, so a window's vectors are known without the model."""

    def __init__(self, vocab: int, dim: int = 8):
        self.table = np.random.default_rng(0).normal(size=(vocab, dim)).astype(np.float32)

    def run(self, _, feeds):
        ids = feeds["input_ids"]
        return [self.table[ids] + 0.1 * np.arange(ids.shape[1], dtype=np.float32)[None, :, None]]


def test_head_of_a_long_text_is_the_mean_of_every_row_of_its_first_window(monkeypatch):
    enc = token_encoder.TokenEncoder(1, model="minilm-int8-dynamic-windows")
    fake = FakeSession(enc.vocab_size)
    monkeypatch.setattr(enc, "_sess", fake)
    texts = [SHORT[0], LONG, ""]
    rows, heads = enc.encode_with_heads(texts)
    unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
    for (ids_a, vec_a), (ids_b, vec_b) in zip(rows, enc.encode(texts)):   # rows are encode's
        np.testing.assert_array_equal(ids_a, ids_b)
        np.testing.assert_array_equal(vec_a, vec_b)
    first = token_windows.windows_of(0, enc._tok.encode(LONG).ids)[0]
    ids = np.array(first.ids)
    content = ~enc._drop[ids]
    want = unit(fake.table[ids] + 0.1 * np.arange(len(ids))[:, None])[content].mean(axis=0)
    np.testing.assert_allclose(heads[1], want, atol=1e-6)
    # the first window's rows past its own share (window 2 owns them) count; they are not rows
    owned = content.copy()
    owned[first.keep_to:] = False
    assert owned.sum() < content.sum()
    np.testing.assert_array_equal(rows[1][0][:owned.sum()], ids[owned])
    assert not np.allclose(heads[1], rows[1][1][:owned.sum()].mean(axis=0), atol=1e-4)
    np.testing.assert_allclose(heads[0], rows[0][1].mean(axis=0), atol=1e-7)   # a short text: all its rows
    assert not heads[2].any()                                                   # an empty text: zeros


def test_passage_vectors_are_unit_heads_and_skip_what_lies_past_the_first_window(encoders):
    from memlib.embed.tokens_backend import MiniLMTokensEmbedder, unit_rows

    _, windowed = encoders
    rows, heads = windowed.encode_with_heads([SHORT[0], LONG])
    np.testing.assert_allclose(heads[0], rows[0][1].mean(axis=0), atol=1e-7)
    vec = unit_rows(heads)
    assert np.allclose(np.linalg.norm(vec, axis=1), 1, atol=1e-6)
    every = rows[1][1].mean(axis=0)          # the needle lies past the first window: not read
    assert not np.allclose(vec[1], every / np.linalg.norm(every), atol=1e-3)
    embedder = MiniLMTokensEmbedder(threads=1)
    assert np.allclose(embedder.embed_passages([LONG])[0], unit_rows(windowed.encode_with_heads([LONG])[1])[0],
                       atol=1e-6)
