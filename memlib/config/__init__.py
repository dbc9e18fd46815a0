"""Typed configuration, one section per stage.

Loaded once at an entrypoint (the CLI in ``jobs/``, the Python API in :mod:`memlib.api`, the
Serve application builder) and passed down; nothing else reads the environment. Precedence
(lowest to highest): built-in defaults < config file (TOML or YAML) < ``MEMLIB__SECTION__KEY``
environment variables (as given by the entrypoint, at load time only)
< CLI overrides (``--set section.key=value``).

The documented default file is ``memlib/defaults/memlib.toml``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from memlib.config.base import BUILD_OUTPUT, RUNTIME, Backend, HeuristicOnly, Section, affects_output
from memlib.config.build_sections import (
    EMBED_BACKENDS,
    EMBED_NATIVE_DIM,
    ClueConfig,
    EmbedConfig,
    EventConfig,
    FactConfig,
    GateConfig,
    GraphConfig,
    IOConfig,
    LLMConfig,
    ReflectionConfig,
    SegmentConfig,
    TripletConfig,
)
from memlib.config.run_sections import (
    NOT_A_DIGEST,
    EvalConfig,
    NightlyConfig,
    RayConfig,
    RetrieveConfig,
    ServeConfig,
)
from memlib.config_sources import ConfigError, env_overrides, parse_override, read_file, set_path

__all__ = [
    "BUILD_OUTPUT", "DEFAULT_FILE", "EMBED_BACKENDS", "EMBED_NATIVE_DIM", "NOT_A_DIGEST", "RUNTIME", "Backend",
    "ClueConfig", "ConfigError", "EmbedConfig", "EvalConfig", "EventConfig", "FactConfig", "GateConfig",
    "GraphConfig", "HeuristicOnly", "IOConfig", "LLMConfig", "MemlibConfig", "NightlyConfig", "RayConfig",
    "ReflectionConfig", "RetrieveConfig", "Section", "SegmentConfig", "ServeConfig", "TripletConfig",
    "affects_output", "load_config",
]


class MemlibConfig(Section):
    io: IOConfig = Field(default_factory=IOConfig)
    embed: EmbedConfig = Field(default_factory=EmbedConfig)
    segment: SegmentConfig = Field(default_factory=SegmentConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    clues: ClueConfig = Field(default_factory=ClueConfig)
    facts: FactConfig = Field(default_factory=FactConfig)
    triplets: TripletConfig = Field(default_factory=TripletConfig)
    events: EventConfig = Field(default_factory=EventConfig)
    reflections: ReflectionConfig = Field(default_factory=ReflectionConfig)
    graph: GraphConfig = Field(default_factory=GraphConfig)
    retrieve: RetrieveConfig = Field(default_factory=RetrieveConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    nightly: NightlyConfig = Field(default_factory=NightlyConfig)
    ray: RayConfig = Field(default_factory=RayConfig)

    def snapshot(self) -> dict[str, Any]:
        """JSON-able view for manifests and logs; secrets are masked."""
        return self.model_dump(mode="json")

    def output_snapshot(self) -> dict[str, dict[str, Any]]:
        """The part of :meth:`snapshot` that decides what a build writes: sections whose
        ``affects_output`` is true, without their fields marked :data:`RUNTIME`, and the fields
        of the other sections marked :data:`BUILD_OUTPUT`."""
        snap = self.snapshot()
        out: dict[str, dict[str, Any]] = {}
        for name in type(self).model_fields:
            section = type(getattr(self, name))
            kept = {k: v for k, v in snap[name].items()
                    if affects_output(section.model_fields[k], section.affects_output)}
            if kept:
                out[name] = kept
        return out


DEFAULT_FILE = Path(__file__).parent.parent / "defaults" / "memlib.toml"


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                environ: dict[str, str] | None = None) -> MemlibConfig:
    """Build the config: defaults < file < ``environ``'s ``MEMLIB__SECTION__KEY`` variables <
    overrides. The entrypoints (the CLI, :func:`memlib.api.load_settings`, the Serve application
    builder) pass the process environment; without ``environ`` no environment is read."""
    data: dict[str, Any] = {}
    if path is not None:
        data = read_file(Path(path))
    for item in env_overrides(dict(environ or {})) + list(overrides or []):
        key, value = parse_override(item)
        set_path(data, key, value)
    try:
        return MemlibConfig.model_validate(data)
    except ValidationError as exc:  # -> one clear line per problem, joined
        raise ConfigError("invalid configuration: " + "; ".join(_problem(e) for e in exc.errors()[:5])) from None
    except Exception as exc:  # noqa: BLE001 - anything else a validator raised, still one line
        raise ConfigError(f"invalid configuration: {' '.join(str(exc).split())}") from None


def _problem(err: dict[str, Any]) -> str:
    where = ".".join(str(x) for x in err.get("loc", ()))
    msg = " ".join(str(err.get("msg", "invalid")).split()).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg
