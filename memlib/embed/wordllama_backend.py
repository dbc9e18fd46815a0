"""WordLlama l2_supercat static token embeddings (256-d weights ship in the wheel).

A text vector is the mean of its token vectors (Llama-2 tokenizer, no special tokens),
L2-normalized. The files are read straight from the installed package: wordllama's own
loader looks for the tokenizer in ~/.cache and would try the network when it is absent.
"""
from __future__ import annotations

import numpy as np

from memlib.embed.base import Embedder, TextKind, package_dir, require_file

PIP_NAME = "wordllama"
WEIGHTS_FILE = "l2_supercat_256.safetensors"
TOKENIZER_FILE = "l2_supercat_tokenizer_config.json"
MAX_TOKENS = 512
DIM = 256


def _load_table() -> np.ndarray:
    from safetensors import safe_open

    path = require_file(package_dir("wordllama", PIP_NAME) / "weights" / WEIGHTS_FILE, PIP_NAME)
    with safe_open(str(path), framework="np", device="cpu") as f:
        return np.ascontiguousarray(f.get_tensor("embedding.weight"), dtype=np.float32)


def _load_tokenizer():
    from tokenizers import Tokenizer

    path = require_file(package_dir("wordllama", PIP_NAME) / "tokenizers" / TOKENIZER_FILE, PIP_NAME)
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_length=MAX_TOKENS)
    tokenizer.no_padding()
    return tokenizer


class WordLlamaEmbedder(Embedder):
    name = "wordllama"
    dim = DIM

    def __init__(self, batch_size: int = 64, threads: int | None = None) -> None:
        super().__init__(batch_size)
        self._table = _load_table()
        self._tokenizer = _load_tokenizer()
        # static lookups: nothing to parallelize, so ``threads`` has no effect here

    def _encode(self, texts: list[str], kind: TextKind) -> np.ndarray:
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        lengths = np.array([len(e.ids) for e in encodings], dtype=np.int64)
        flat = np.clip(np.fromiter((i for e in encodings for i in e.ids), dtype=np.int64, count=int(lengths.sum())),
                       0, self._table.shape[0] - 1)
        sums = np.zeros((len(texts), DIM), dtype=np.float32)
        np.add.at(sums, np.repeat(np.arange(len(texts)), lengths), self._table[flat])
        return sums / np.maximum(lengths, 1)[:, None]
