"""Response cache on the store's filesystem: one JSON file per key.

The key is the sha256 of the model, messages, output schema, sampling parameters, prompt
version and cache version. Credentials and the endpoint address never enter the key or the
files, so a cache can be shared between endpoints serving the same model.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from memlib.io.files import atomic_write_json


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
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None  # a torn or foreign file is a miss; the next put replaces it

    def put(self, key: str, entry: dict[str, Any]) -> None:
        atomic_write_json(self._path(key), entry, durable=False, indent=None)

    def __len__(self) -> int:
        return sum(1 for _ in self.root.glob("*/*.json")) if self.root.exists() else 0
