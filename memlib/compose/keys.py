"""The reuse keys of a build, assembled here and nowhere else.

- The **build key** (:func:`build_key`) covers everything besides the input that decides a
  tenant's output. An incremental run carries a tenant over only under the same key.
- The **session build key** (:func:`session_build_key`) is the build key plus what decides the
  session outputs a build keeps. Those outputs live under ``cache/sessions/<session build key>/``.

Their values are part of every published store: a change here makes stores built before rebuild
everything, so each constant says when it must be raised.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from memlib.compose.sessions import SESSION_TABLES
from memlib.compose.vectors import auto_encoder_model, own_pass_kinds
from memlib.config import MemlibConfig
from memlib.embed.space import similarity_floor

# What a build writes for the same input and config: raised whenever the code changes a built
# tenant's output, so the next incremental run rebuilds every tenant instead of carrying over
# tenants built the old way. 2: derived node vectors pooled over their text's token positions
# (docs/decisions/0008-span-pooled-derived-vectors.md), clue keyphrases drafted per session. 3: SIMILAR
# cosines computed per pair, the same whatever the tenant's size (memlib.text.clues.exact_cosines;
# docs/decisions/0014-tenant-reuse.md). 4: the tenant means of fallback ids from exact per-id sums,
# kept with each node's local sum (memlib.compose.span_pool IdSums, Fallback; same decision). 5: a
# weekday said of a habit ("every Sunday", "on Saturday mornings") is no longer resolved to one date
# in facts and events (memlib.text.dates). 6: a fact's vector is its pooled vector plus its own
# text's, normalized (memlib.compose.vectors BLEND_KINDS; docs/decisions/0009-fact-own-text.md).
BUILD_FORMAT = 6

# how the embed pass runs the encoder (memlib.compose.vectors.one_by_one): outputs kept by an
# earlier way of encoding are never reused
EMBED_PASS = "one-by-one;passage=first-window"

# the file format of a kept block's turn vectors (memlib.compose.session_store): an uncompressed
# Arrow IPC file, memory-mapped when read, so a tenant's sessions are read back without decoding or
# copying them. Parquet (uncompressed float16 column) took 3.4-4.7 s to read the 669 MB of a
# 500-session LongMemEval tenant; the IPC files map in 0.01 s, and the node-vector pooling then
# reads only the rows it weighs
VECTORS_FORMAT = "arrow-ipc"


def prompt_versions(cfg: MemlibConfig) -> dict[str, str]:
    """Prompt hashes of every LLM task (empty when the prompts cannot be loaded)."""
    from memlib.llm.prompts import DEFAULT_DIR, PromptError, load_prompts, prompt_hashes

    try:
        return prompt_hashes(load_prompts(Path(cfg.llm.prompts_dir) if cfg.llm.prompts_dir else DEFAULT_DIR))
    except (PromptError, OSError):
        return {}


def build_key(cfg: MemlibConfig, recipe: str, prompts: dict[str, str] | None = None) -> str:
    """Hash of everything besides the input that decides a tenant's output (:data:`BUILD_FORMAT`,
    the recipe, the prompts, the config sections that change output)."""
    parts: dict[str, Any] = {"format": BUILD_FORMAT, "recipe": recipe,
                             "prompts": prompts if prompts is not None else prompt_versions(cfg)}
    parts.update(cfg.output_snapshot())  # fields marked config.RUNTIME and post-build sections left out
    parts["own_pass_kinds"] = list(own_pass_kinds(cfg))  # embedded by their own text (summed, or alone)
    floor = similarity_floor(cfg.embed)
    if floor:  # likewise: only a backend whose cosine thresholds are moved
        parts["similarity_floor"] = floor
    blob = json.dumps(parts, sort_keys=True, default=str).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


def session_build_key(cfg: MemlibConfig, key: str) -> str:
    """The key session outputs are kept under: the build key plus what decides the embed pass's
    token vectors (``auto``'s encoder, whether token matrices are kept, how texts are encoded)."""
    # the tables a session keeps and the vectors' file format: outputs of another layout are never read
    kept = f"{','.join(SESSION_TABLES)};vectors={VECTORS_FORMAT}"
    extra = f"{auto_encoder_model(cfg)}|{cfg.retrieve.precompute_token_matrices}|{EMBED_PASS}|{kept}"
    return f"{key}-{hashlib.sha256(extra.encode()).hexdigest()[:8]}"
