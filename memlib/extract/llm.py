"""LLM extraction backends: importing this module registers them (see ``base.BUILTIN_MODULES``)."""
from __future__ import annotations

from memlib.extract import llm_events, llm_facts, llm_reflections, llm_triplets  # noqa: F401  (register)
