"""Response cache on the store's filesystem: one JSON file per key.

The key is the sha256 of the model, messages, output schema, sampling parameters, prompt
version and cache version. Credentials and the endpoint address never enter the key or the
files, so a cache can be shared between endpoints serving the same model.

Each file holds its entry and ``checksum``, the sha256 of the entry's canonical JSON: a file
whose bytes changed after it was written (a flipped digit still parses) is a miss, logged, and
the call is made again (docs/decisions/0031-kept-file-checksums.md). Files written before
checksums are read as before.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from memlib.io.files import atomic_write_json

log = logging.getLogger("memlib.llm")
CHECKSUM_KEY = "checksum"


def entry_checksum(entry: dict[str, Any]) -> str:
    """sha256 of ``entry`` (without its checksum) as canonical JSON."""
    body = {k: v for k, v in entry.items() if k != CHECKSUM_KEY}
    blob = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()


def cache_key(*, model: str, messages: list[dict[str, str]], schema: dict[str, Any],
              sampling: dict[str, Any], prompt_version: str, cache_version: str) -> str:
    payload = {"model": model, "messages": messages, "schema": schema, "sampling": sampling,
               "prompt_version": prompt_version, "cache_version": cache_version}
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ResponseCache:
    """``<root>/<key[:2]>/<key>.json`` files written atomically (temp file + rename)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        path = self._path(key)
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError):
            log.warning("LLM response %s is unreadable: asked again", path)
            return None  # a torn or foreign file is a miss; the next put replaces it
        if not isinstance(entry, dict):
            log.warning("LLM response %s is not a JSON object: asked again", path)
            return None
        written = entry.pop(CHECKSUM_KEY, None)
        if written is not None and written != entry_checksum(entry):
            log.warning("LLM response %s is damaged (its checksum does not match): asked again", path)
            return None
        return entry

    def put(self, key: str, entry: dict[str, Any]) -> None:
        atomic_write_json(self._path(key), {**entry, CHECKSUM_KEY: entry_checksum(entry)}, durable=False, indent=None)

    def __len__(self) -> int:
        return sum(1 for _ in self.root.glob("*/*.json")) if self.root.exists() else 0
