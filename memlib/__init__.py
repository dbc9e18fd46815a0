"""memlib: long-term memory for conversational agents, built in batch and served at scale.

``memlib.open_store(path)`` opens a published store for queries (:mod:`memlib.api`); building one
needs Ray and is ``jobs.api.build``. ``import memlib`` loads neither pyarrow, lancedb nor Ray: the
names below are imported on first use."""
from __future__ import annotations

from pathlib import Path
from typing import Any

__version__ = "0.1.0"
SAMPLE = Path(__file__).parent / "data" / "sample_conversations.jsonl"  # the bundled sample input (4 tenants)
__all__ = ["SAMPLE", "Store", "__version__", "load_settings", "open_store"]
_API = {"Store", "load_settings", "open_store"}


def __getattr__(name: str) -> Any:
    if name in _API:
        from memlib import api

        return getattr(api, name)
    if name == "build":  # the build runs on Ray, which the library never imports: say where it is
        raise AttributeError("memlib.build is jobs.api.build (`from jobs.api import build`): a build runs on Ray, "
                             "which `import memlib` never loads")
    raise AttributeError(f"module 'memlib' has no attribute {name!r}")
