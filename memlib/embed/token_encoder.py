"""``auto``'s token encoder: content-token ids and L2-normalized token vectors of texts from the
MiniLM ONNX model of :mod:`memlib.embed.token_model`; one encoder per (threads, model,
model cache) per process (:func:`get_encoder`)."""
from __future__ import annotations

import re
import threading
from collections import OrderedDict
from concurrent.futures import Future
from pathlib import Path
from typing import Sequence

import numpy as np

from memlib.embed import token_windows
from memlib.embed.minilm_backend import load_session, load_tokenizer
from memlib.embed.token_model import DEFAULT_MODEL, WINDOWED, model_file

MAX_TOKENS = 128
AHEAD_KEPT = 64
_PUNCT = re.compile(r"^\W+$")
_SPECIAL = frozenset({"[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"})


class TokenEncoder:
    """Content-token vectors (L2-normalized float32) and token ids for texts; a ``-windows``
    encoder reads long texts by windows (every content token once, in text order; batches of
    ``batch_size`` windows: see memlib/embed/token_windows.py)."""

    def __init__(self, threads: int | None = 1, batch_size: int = 32, model: str = DEFAULT_MODEL,
                 model_cache: str | Path | None = None):
        path, self.tag = model_file(model, model_cache)
        self.windowed = model.endswith(WINDOWED)
        self._tok = load_tokenizer(MAX_TOKENS)
        self._tok.no_padding()  # batches are padded here, per batch of windows
        if self.windowed:
            self._tok.no_truncation()
        self._sess = load_session(threads, path)
        self._inputs = {i.name for i in self._sess.get_inputs()}
        self.batch_size = batch_size
        vocab = self._tok.get_vocab()
        self.vocab_size = max(vocab.values()) + 1
        self._drop = np.zeros(self.vocab_size, dtype=bool)
        for tok, i in vocab.items():
            self._drop[i] = tok in _SPECIAL or bool(_PUNCT.match(tok))
        self._ahead: OrderedDict[str, Future] = OrderedDict()  # queries encoded ahead (encode_ahead)
        self._ahead_lock = threading.Lock()

    def encode_ahead(self, query: str) -> None:
        """Encode ``query`` now for a :meth:`encode_query` about to ask for it: a service encodes a
        cold tenant's query while the tenant opens. Kept until asked for (the last
        :data:`AHEAD_KEPT`)."""
        fut: Future = Future()
        with self._ahead_lock:
            if query in self._ahead:
                return
            self._ahead[query] = fut
            while len(self._ahead) > AHEAD_KEPT:
                self._ahead.popitem(last=False)
        try:
            fut.set_result(self.encode([query])[0])
        except Exception as exc:  # noqa: BLE001 - raised to the one who asks
            fut.set_exception(exc)

    def encode_query(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`encode` of one query, taken from :meth:`encode_ahead` when it was (or is being)
        encoded ahead: the same arrays."""
        with self._ahead_lock:
            fut = self._ahead.pop(query, None)
        return fut.result() if fut is not None else self.encode([query])[0]

    def encode(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per text: (token ids, (n_tokens, dim) unit vectors), content tokens only."""
        return self.encode_with_heads(texts)[0]

    def encode_with_heads(self, texts: Sequence[str]) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[int]]:
        """:meth:`encode`, plus per text the number of its rows read by its first window (all of
        them for a text that fits one window)."""
        limit = token_windows.MAX_WINDOWS if self.windowed else 1
        windows = token_windows.split([e.ids for e in self._tok.encode_batch(list(texts))], max_windows=limit)
        out = [r for start in range(0, len(windows), self.batch_size)
               for r in self._batch(windows[start:start + self.batch_size])]
        return (token_windows.joined(windows, out, len(texts)),
                token_windows.first_window_rows(windows, out, len(texts)))

    def content_ids(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Per text: the token ids :meth:`encode` returns vectors for, in the same order, without
        running the model (what the first stage of memlib/retrieve/first_stage.py indexes)."""
        limit = token_windows.MAX_WINDOWS if self.windowed else 1
        windows = token_windows.split([e.ids for e in self._tok.encode_batch(list(texts))], max_windows=limit)
        out = []
        for start in range(0, len(windows), 4096):
            ids, mask, share = token_windows.padded(windows[start:start + 4096])
            keep = (mask == 1) & ~self._drop[ids] & share
            out += [(ids[row][keep[row]], ids[row][keep[row]]) for row in range(ids.shape[0])]
        return [i for i, _ in token_windows.joined(windows, out, len(texts))]

    def _batch(self, windows: list[token_windows.Window]) -> list[tuple[np.ndarray, np.ndarray]]:
        ids, mask, share = token_windows.padded(windows)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._sess.run(None, feeds)[0]  # onnxruntime's run is thread-safe
        res = []
        for row in range(len(windows)):
            keep = (mask[row] == 1) & ~self._drop[ids[row]] & share[row]
            vec = hidden[row][keep].astype(np.float32)
            vec /= np.maximum(np.linalg.norm(vec, axis=1, keepdims=True), 1e-12)
            res.append((ids[row][keep], vec))
        return res


_ENCODERS: dict[tuple[int | None, str, str | None], TokenEncoder] = {}
_GUARD = threading.Lock()


def get_encoder(threads: int | None = 1, model: str = DEFAULT_MODEL,
                model_cache: str | Path | None = None) -> TokenEncoder:
    key = (threads, model, None if model_cache is None else str(model_cache))
    with _GUARD:
        if key not in _ENCODERS:
            _ENCODERS[key] = TokenEncoder(threads, model=model, model_cache=model_cache)
        return _ENCODERS[key]
