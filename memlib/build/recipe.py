"""Named build recipes: each is an ordered list of stage names, defined in one place.

A recipe says *which* stages run and in which order; the functions behind the names live in
:mod:`memlib.build.compose` (single process) and are wrapped for Ray Data in ``pipelines/``.
Stages left out of a recipe are skipped, and their outputs are simply absent from the store.
"""
from __future__ import annotations

from enum import Enum


class BuildStage(str, Enum):
    """Per-tenant stages in data-flow order (see DESIGN.md, "Data flow")."""
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


class JobStage(str, Enum):
    """Driver-side stages of a store build, around the per-tenant recipe."""
    READ = "read"
    TENANTS = "tenants"                # session pass + tenant stages (graph included) on Ray Data
    GRAPH = "graph"                    # (older manifests: the graph pass before it joined the tenant stage)
    WRITE = "write"
    INDEX = "index"
    PUBLISH = "publish"


EXTRACTION = (BuildStage.FACTS, BuildStage.TRIPLETS, BuildStage.EVENTS, BuildStage.REFLECTIONS)
ALWAYS = (BuildStage.TURN_NODES, BuildStage.EMBED_TURNS, BuildStage.STRUCTURE, BuildStage.EMBED_NODES,
          BuildStage.FINALIZE)

RECIPES: dict[str, tuple[BuildStage, ...]] = {
    # everything: the memory of every retrieval strategy
    "full": tuple(BuildStage),
    # episodes only: turns, segments, sessions, clues (no extraction); fast, for dense/bm25 baselines
    "episodes": (BuildStage.TURN_NODES, BuildStage.EMBED_TURNS, BuildStage.SEGMENT, BuildStage.GATE,
                 BuildStage.STRUCTURE, BuildStage.CLUES, BuildStage.EMBED_NODES, BuildStage.LINK,
                 BuildStage.FINALIZE),
    # raw turns: the smallest store a retriever can use
    "turns": ALWAYS,
}
DEFAULT_RECIPE = "full"


class UnknownRecipeError(KeyError):
    pass


def get_recipe(name: str) -> tuple[BuildStage, ...]:
    """The stages of recipe ``name``, validated (order as in :class:`BuildStage`)."""
    if name not in RECIPES:
        raise UnknownRecipeError(f"unknown recipe {name!r}; known: {', '.join(sorted(RECIPES))}")
    stages = RECIPES[name]
    missing = [s.value for s in ALWAYS if s not in stages]
    if missing:
        raise UnknownRecipeError(f"recipe {name!r} lacks required stages {missing}")
    order = list(BuildStage)
    return tuple(sorted(stages, key=order.index))
