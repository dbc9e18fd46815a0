"""Which token encoder ``auto`` uses: the names in :data:`MODELS` and the ONNX file and tag of
each (the tag names the exact weights and how long texts are read, so token matrices of one
encoder are never reused for another)."""
from __future__ import annotations

from pathlib import Path

from memlib.embed import token_windows
from memlib.embed.minilm_backend import model_path
from memlib.embed.quantize import dynamic_int8, file_digest

WINDOWED = "-windows"  # encoder names ending so read long texts by windows (memlib/embed/token_windows.py)
DEFAULT_MODEL = "minilm-int8-dynamic-windows"
MODELS = ("minilm-int8-dynamic-windows", "minilm-int8-windows", "minilm-int8-dynamic", "minilm-int8")


def model_file(model: str, model_cache: str | Path | None = None) -> tuple[Path, str]:
    """(ONNX file, tag naming the exact weights and text handling) of an encoder name in :data:`MODELS`.

    ``minilm-int8`` is the bundled file (int8 weights, float32 compute); ``minilm-int8-dynamic``
    is its dynamically quantized copy, derived once and cached (memlib/embed/quantize.py):
    about half the CPU per query (measured: docs/int8-kernels.md). The tag of the derived copy
    carries its digest, so token matrices encoded by another derivation are not reused. Both
    read a text's first :data:`~memlib.embed.token_encoder.MAX_TOKENS` tokens; ``-windows``
    (default) reads it all by windows and its tag says so: matrices of the truncating encoder
    are never reused for it.
    ``model_cache`` is ``embed.model_cache`` (None: ~/.cache/memlib/models)."""
    base = model.removesuffix(WINDOWED)
    suffix = f"-{token_windows.spec()}" if model.endswith(WINDOWED) else ""
    if model not in MODELS:
        raise ValueError(f"unknown token encoder {model!r}; known: {', '.join(MODELS)}")
    if base == "minilm-int8":
        return model_path(), "all-MiniLM-L6-v2-int8" + suffix
    path = dynamic_int8(model_path(), "all-MiniLM-L6-v2", model_cache)
    return path, f"all-MiniLM-L6-v2-dynint8-{file_digest(path)[:12]}" + suffix
