"""One extractor interface for every extraction and backend.

An extraction (facts, triplets, events, reflections) is implemented by one class per
:class:`~memlib.config.Backend`. Every implementation takes an
:class:`ExtractionContext` and returns an :class:`ExtractResult` whose ``nodes`` conform
to :data:`memlib.schema.NODES_NO_EMBEDDING` and ``edges`` to :data:`memlib.schema.EDGES`.

Implementations register themselves with :func:`register` (a class decorator); callers
look them up with :func:`get_extractor`. LLM backends live in their own modules and
register under ``Backend.LLM`` with the same extraction key. The build runs them through
:func:`memlib.compose.steps.extract_one` (one orchestration for every backend).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.config import Backend, MemlibConfig
from memlib.schema import Role


class Extraction(str, Enum):
    """The extractions, in dependency order (events and reflections read the facts). This is the
    one list: recipe steps, the LLM-capable steps, ``--extractor`` and the config sections of the
    same names all derive from it."""
    FACTS = "facts"
    TRIPLETS = "triplets"
    EVENTS = "events"
    REFLECTIONS = "reflections"


def backend_of(cfg: MemlibConfig, extraction: Extraction) -> Backend:
    """The configured backend of ``extraction`` (config section == extraction name)."""
    return Backend(getattr(cfg, extraction.value).backend)


def configured(cfg: MemlibConfig) -> list[Extraction]:
    """The extractions a build runs under ``cfg`` (reflections only when enabled), in order."""
    return [e for e in Extraction if e is not Extraction.REFLECTIONS or cfg.reflections.enabled]


@dataclass
class ExtractResult:
    """Nodes (``NODES_NO_EMBEDDING``) and edges (``EDGES``) produced by a stage."""
    nodes: pa.Table = field(default_factory=lambda: schema.empty(schema.NODES_NO_EMBEDDING))
    edges: pa.Table = field(default_factory=lambda: schema.empty(schema.EDGES))

    def conformed(self, name: str = "extract") -> ExtractResult:
        return ExtractResult(
            nodes=schema.conform(self.nodes, schema.NODES_NO_EMBEDDING, name=f"{name}.nodes"),
            edges=schema.conform(self.edges, schema.EDGES, name=f"{name}.edges"),
        )

    @staticmethod
    def concat(results: Iterable[ExtractResult]) -> ExtractResult:
        """Concatenate results; nodes with the same ``node_id`` are kept once (first wins)."""
        parts = [r.conformed() for r in results]
        if not parts:
            return ExtractResult()
        nodes = pa.concat_tables([p.nodes for p in parts])
        edges = pa.concat_tables([p.edges for p in parts])
        return ExtractResult(nodes=_dedup_first(nodes, "node_id"), edges=edges)


def _dedup_first(table: pa.Table, key: str) -> pa.Table:
    if table.num_rows == 0:
        return table
    idx = pa.array(range(table.num_rows), pa.int64())
    first = (table.select([key]).append_column("_i", idx)
             .group_by(key, use_threads=False).aggregate([("_i", "min")]))
    keep = pc.sort_indices(first.column("_i_min"))
    return table.take(pc.take(first.column("_i_min"), keep))


@dataclass
class ExtractionContext:
    """Everything an extractor may read.

    turns:      ``schema.TURNS`` rows of one or more tenants.
    kept_turn_ids: turn node ids that passed the memory gate; ``None`` keeps every turn.
    config:     the run's :class:`MemlibConfig`.
    nlp:        an optional shared spaCy ``Language`` (loaded once per actor by the caller).
    facts:      fact nodes already extracted in this run (reflections and events read them).
    extras:     free-form handles for backends (e.g. an LLM client built once per actor).
    """
    turns: pa.Table
    kept_turn_ids: frozenset[str] | None = None
    config: MemlibConfig = field(default_factory=MemlibConfig)
    nlp: Any = None
    facts: pa.Table | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def kept_turns(self) -> pa.Table:
        """Turns that passed the gate and whose role is one extraction reads
        (``gate.extract_roles``), in (tenant, conversation, session, turn) order."""
        turns = self.turns
        if self.kept_turn_ids is not None:
            mask = pc.is_in(turns.column("node_id"), value_set=pa.array(sorted(self.kept_turn_ids), pa.string()))
            turns = turns.filter(mask)
        roles = sorted({r.value for r in self.config.gate.extract_roles})
        if len(roles) < len(Role):
            turns = turns.filter(pc.is_in(turns.column("role"), value_set=pa.array(roles, pa.string())))
        return turns.sort_by([("tenant_id", "ascending"), ("conversation_id", "ascending"),
                              ("session_index", "ascending"), ("turn_index", "ascending")])

    def get_nlp(self) -> Any:
        """The shared spaCy pipeline, loading (and caching) the configured model on first use."""
        if self.nlp is None:
            from memlib.text.nlp import load_nlp
            self.nlp = load_nlp(self.config.triplets.spacy_model)
        return self.nlp


@runtime_checkable
class Extractor(Protocol):
    """A stage implementation. ``name`` is the stage key, ``backend`` its backend."""
    name: Extraction
    backend: Backend

    def run(self, ctx: ExtractionContext) -> ExtractResult: ...


_REGISTRY: dict[tuple[Extraction, Backend], Callable[[], Extractor]] = {}


class UnknownExtractorError(KeyError):
    pass


def register(cls: type) -> type:
    """Class decorator: register ``cls`` under ``(cls.name, cls.backend)``."""
    key = (Extraction(cls.name), Backend(cls.backend))
    _REGISTRY[key] = cls
    return cls


# the modules that register each backend's extractors (importing one registers its classes); a
# backend's modules are imported when one of its extractors is first asked for, so a heuristic
# build never imports the LLM stack (the OpenAI client costs about half a second per process)
BUILTIN_MODULES: dict[Backend, tuple[str, ...]] = {
    Backend.HEURISTIC: ("memlib.extract.facts", "memlib.extract.triplets", "memlib.extract.events",
                        "memlib.extract.reflections"),
    Backend.LLM: ("memlib.extract.llm",),
}


def _load_builtin(backends: Iterable[Backend] = tuple(Backend)) -> None:
    """Import the modules of ``backends``; importing one registers its classes via :func:`register`."""
    for backend in backends:
        for mod in BUILTIN_MODULES[backend]:
            try:
                importlib.import_module(mod)
            except ModuleNotFoundError as exc:
                if exc.name != mod:
                    raise


def get_extractor(stage: Extraction | str, backend: Backend | str) -> Extractor:
    """A new instance of the extractor registered for ``(stage, backend)``."""
    key = (Extraction(stage), Backend(backend))
    if key not in _REGISTRY:
        _load_builtin([key[1]])
    if key not in _REGISTRY:
        known = sorted(f"{s.value}/{b.value}" for s, b in _REGISTRY)
        raise UnknownExtractorError(f"no extractor for {key[0].value}/{key[1].value}; known: {known}")
    return _REGISTRY[key]()


def registered() -> list[tuple[Extraction, Backend]]:
    _load_builtin()
    return sorted(_REGISTRY, key=lambda k: (k[0].value, k[1].value))
