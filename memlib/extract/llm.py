"""LLM extraction backends: importing this module registers them (see ``base.BUILTIN_MODULES``)."""
from __future__ import annotations

from memlib.extract import llm_facts  # noqa: F401  (registers facts/llm)
