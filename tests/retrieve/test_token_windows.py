"""auto's token encoder reads long texts by windows (memlib/embed/token_windows.py)."""
from __future__ import annotations

import numpy as np
import pytest

from memlib.embed import token_encoder, token_model, token_windows
from memlib.retrieve import late, matrix_cache

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


def test_passage_vector_of_a_long_text_is_its_first_windows_mean(encoders):
    from memlib.embed.tokens_backend import pooled

    _, windowed = encoders
    (short_ids, short_vecs), (long_ids, long_vecs) = windowed.encode([SHORT[0], LONG])
    _, heads = windowed.encode_with_heads([SHORT[0], LONG])
    assert heads[0] == len(short_ids)                      # a short text: every row
    assert 0 < heads[1] < len(long_ids)                    # a long one: its first window's share
    first = token_windows.windows_of(0, windowed._tok.encode(LONG).ids)[0]
    assert heads[1] <= first.keep_to - first.keep_from     # punctuation rows are dropped
    vec = pooled([short_vecs, long_vecs], heads=heads)
    want = long_vecs[:heads[1]].mean(axis=0)
    assert np.allclose(vec[1], want / np.linalg.norm(want), atol=1e-6)
    assert np.allclose(vec[0], pooled([short_vecs])[0], atol=1e-7)
    # the needle lies past the first window: the passage vector does not read it
    assert not np.allclose(vec[1], pooled([long_vecs])[0], atol=1e-3)
