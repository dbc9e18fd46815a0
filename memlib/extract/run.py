"""Run every configured extraction stage over one context and concatenate the results."""
from __future__ import annotations

import pyarrow as pa

from memlib.config import Backend, MemlibConfig
from memlib.extract.base import Extraction, ExtractionContext, ExtractResult, get_extractor


def stage_backends(cfg: MemlibConfig) -> list[tuple[Extraction, Backend]]:
    """The stages to run, in dependency order (facts before events/reflections), with their backends."""
    plan = [(Extraction.FACTS, cfg.facts.backend), (Extraction.TRIPLETS, cfg.triplets.backend),
            (Extraction.EVENTS, cfg.events.backend)]
    if cfg.reflections.enabled:
        plan.append((Extraction.REFLECTIONS, cfg.reflections.backend))
    return plan


def run_extractors(ctx: ExtractionContext, cfg: MemlibConfig | None = None) -> ExtractResult:
    """All configured stages over ``ctx``; the facts stage's nodes are handed to later stages."""
    if cfg is not None:
        ctx.config = cfg
    results = []
    for stage, backend in stage_backends(ctx.config):
        res = get_extractor(stage, backend).run(ctx).conformed(stage.value)
        if stage is Extraction.FACTS:
            ctx.facts = res.nodes
        results.append(res)
    return ExtractResult.concat(results)


def extract_table(turns: pa.Table, kept_turn_ids: list[str] | None, cfg: MemlibConfig,
                  nlp: object = None) -> ExtractResult:
    """Convenience wrapper for pipeline stages: turns (+ gate output) in, nodes + edges out."""
    kept = frozenset(kept_turn_ids) if kept_turn_ids is not None else None
    return run_extractors(ExtractionContext(turns=turns, kept_turn_ids=kept, config=cfg, nlp=nlp))
