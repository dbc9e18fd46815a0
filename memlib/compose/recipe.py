"""Named build recipes: each is an ordered list of steps, defined in one place.

A recipe says *which* steps run and in which order; the functions behind the names live in
:mod:`memlib.compose.reference` (single process) and are wrapped for Ray Data in ``pipelines/``.
Steps left out of a recipe are skipped, and their outputs are simply absent from the store.
"""
from __future__ import annotations

from enum import Enum

from memlib.extract.base import Extraction


class Step(str, Enum):
    """Recipe steps (per session, then per tenant) in data-flow order (docs/architecture.md, "Steps, in order")."""
    TURN_NODES = "turn_nodes"          # one node per turn (text = "speaker: text [image: caption]")
    EMBED_TURNS = "embed_turns"        # turn texts through the embedder, once
    SEGMENT = "segment"                # topic segments (reuses the turn vectors)
    GATE = "gate"                      # memory gate + extractive segment summaries
    STRUCTURE = "structure"            # session/segment nodes, NEXT / IN_SEGMENT / IN_SESSION edges
    CLUES = "clues"                    # one clue per session (AssoMem)
    FACTS = "facts"                    # facts + concepts (GAAMA)
    TRIPLETS = "triplets"              # triplets + entities (MemORAI, PersonalAI)
    EVENTS = "events"                  # events / dates (MAGMA)
    REFLECTIONS = "reflections"        # reflections over facts (GAAMA)
    EMBED_NODES = "embed_nodes"        # derived node vectors, span-pooled from their turns (no model pass)
    LINK = "link"                      # merge clues, SIMILAR edges (uses the node vectors)
    FINALIZE = "finalize"              # drop dangling edges, conform to schemas


class Phase(str, Enum):
    """Driver-side phases of a store build, around the recipe steps (timed in the manifest)."""
    READ = "read"
    RAY_START = "ray_start"            # local Ray coming up (inside ``read``: overlaps the sharding)
    TENANTS = "tenants"                # session pass + tenant stages (graph included) on Ray Data
    WRITE = "write"
    INDEX = "index"
    PUBLISH = "publish"


# the extraction steps, every one LLM-capable: the same names as memlib.extract.base.Extraction
EXTRACTION = tuple(Step(e.value) for e in Extraction)
ALWAYS = (Step.TURN_NODES, Step.EMBED_TURNS, Step.STRUCTURE, Step.EMBED_NODES,
          Step.FINALIZE)

RECIPES: dict[str, tuple[Step, ...]] = {
    # everything: the memory of every retrieval strategy
    "full": tuple(Step),
    # episodes only: turns, segments, sessions, clues (no extraction); fast, for dense/bm25 baselines
    "episodes": (Step.TURN_NODES, Step.EMBED_TURNS, Step.SEGMENT, Step.GATE,
                 Step.STRUCTURE, Step.CLUES, Step.EMBED_NODES, Step.LINK,
                 Step.FINALIZE),
    # raw turns: the smallest store a retriever can use
    "turns": ALWAYS,
}
DEFAULT_RECIPE = "full"


class UnknownRecipeError(KeyError):
    pass


def get_recipe(name: str) -> tuple[Step, ...]:
    """The steps of recipe ``name``, validated (order as in :class:`Step`)."""
    if name not in RECIPES:
        raise UnknownRecipeError(f"unknown recipe {name!r}; known: {', '.join(sorted(RECIPES))}")
    stages = RECIPES[name]
    missing = [s.value for s in ALWAYS if s not in stages]
    if missing:
        raise UnknownRecipeError(f"recipe {name!r} lacks required steps {missing}")
    order = list(Step)
    return tuple(sorted(stages, key=order.index))
