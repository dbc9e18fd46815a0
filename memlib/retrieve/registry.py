"""The one registry of retrieval strategies.

Strategies register with ``@register("name")`` in their module under
``memlib/retrieve/``. The registry imports those modules on first use (not at import
time), so a new strategy file is picked up without editing this one.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable, TypeVar

from memlib.retrieve.base import RetrievalError, Strategy

_REGISTRY: dict[str, type] = {}
_CORE_MODULES = frozenset({"base", "registry", "kernels", "tenant"})
_BROKEN: dict[str, str] = {}  # module -> import error, shown when a name is not found
_discovered = False

T = TypeVar("T", bound=type)


class UnknownStrategyError(RetrievalError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0] if self.args else ""


def register(name: str) -> Callable[[T], T]:
    """Class decorator: ``@register("bm25") class BM25(StrategyBase): ...``."""
    def deco(cls: T) -> T:
        existing = _REGISTRY.get(name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise RetrievalError(f"strategy name {name!r} registered twice ({existing.__module__}, {cls.__module__})")
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return deco


def discover() -> None:
    """Import every strategy module in memlib/retrieve (once)."""
    global _discovered
    if _discovered:
        return
    import memlib.retrieve as pkg

    for mod in sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)):
        if mod not in _CORE_MODULES and not mod.startswith("_"):
            try:
                importlib.import_module(f"memlib.retrieve.{mod}")
            except Exception as exc:  # noqa: BLE001 - one broken strategy module must not hide the others
                _BROKEN[mod] = f"{type(exc).__name__}: {exc}"
    _discovered = True


def list_strategies() -> list[str]:
    discover()
    return sorted(_REGISTRY)


def strategy_class(name: str) -> type:
    discover()
    try:
        return _REGISTRY[name]
    except KeyError:
        msg = f"unknown retrieval strategy {name!r}; known strategies: {', '.join(sorted(_REGISTRY)) or 'none'}"
        if _BROKEN:
            msg += "; modules that failed to import: " + "; ".join(f"{m} ({e})" for m, e in sorted(_BROKEN.items()))
        raise UnknownStrategyError(msg) from None


def strategy_params(name: str, cfg: Any | None) -> dict[str, Any]:
    """``cfg.retrieve.params[name]`` (empty when absent)."""
    if cfg is None:
        return {}
    return dict(cfg.retrieve.params.get(name, {}))


def get_strategy(name: str, cfg: Any | None = None, **overrides: Any) -> Strategy:
    """An instance of strategy ``name`` with its defaults < cfg.retrieve.params[name] < overrides.

    Strategies whose constructor wants the whole config accept a ``cfg`` keyword."""
    cls = strategy_class(name)
    params = strategy_params(name, cfg)
    params.update(overrides)
    if getattr(cls, "wants_config", False):
        return cls(params, cfg=cfg)
    return cls(params)


def parse_strategies(spec: str | list[str]) -> list[str]:
    """``"bm25,dense"`` -> validated names (raises UnknownStrategyError)."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    for n in names:
        strategy_class(n)
    return names
