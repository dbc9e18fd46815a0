"""memlib from Python: open a published store and ask it what the service would answer.

    import memlib
    store = memlib.open_store("store/")
    answer = store.search("maya", "Where did Maya move?", k=5)
    for node in answer.results: print(node.score, node.turn_ids, node.text)

Every answer is the service's own model (:mod:`memlib.serve.models`), computed by the same
:class:`~memlib.serve.service.SearchService` the HTTP app runs, with the same validation: a bad
request raises :class:`~memlib.serve.errors.ApiError` (``.code``, ``.reason``). No Ray, no
server; the tenant's tables and graph are loaded in this process on first use. Building a store
needs Ray and lives above the library: ``jobs.api.build``.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the service and its models import pyarrow and lancedb: loaded by open_store
    from memlib.config import MemlibConfig
    from memlib.serve.models import NodeGraphResponse, SearchResponse, SessionResponse
    from memlib.serve.service import SearchService


def load_settings(config: MemlibConfig | str | Path | None = None,
                  settings: Mapping[str, Any] | Sequence[str] | None = None) -> MemlibConfig:
    """A config as the command line makes it: defaults < ``config`` (a file, or a config already
    made) < ``MEMLIB__SECTION__KEY`` environment variables < ``settings`` (``{"retrieve.k": 5}``
    or ``["retrieve.k=5"]``, the ``--set`` lines)."""
    from memlib.config import MemlibConfig, load_config

    lines = setting_lines(settings)
    if not isinstance(config, MemlibConfig):
        return load_config(config, lines, environ=os.environ)
    if not lines:
        return config
    from memlib.config_sources import ConfigError, parse_override, set_path

    data = config.model_dump()
    for item in lines:
        key, value = parse_override(item)
        set_path(data, key, value)
    try:
        return MemlibConfig.model_validate(data)
    except ValueError as exc:
        raise ConfigError(f"invalid configuration: {' '.join(str(exc).split())[:300]}") from None


def setting_lines(settings: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    """``{"retrieve.k": 5}`` as ``["retrieve.k=5"]`` (a string value as written, others as JSON)."""
    import json

    if isinstance(settings, Mapping):
        return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in settings.items()]
    return list(settings or [])


class Store:
    """A published memory store, opened for queries (:func:`open_store`). It answers from the
    version published when it was opened; :meth:`refresh` moves it to a newer one."""

    def __init__(self, path: str | Path, cfg: MemlibConfig):
        from memlib.serve.auth import Principal, Role
        from memlib.serve.service import SearchService

        self.path = Path(path).resolve()  # answers stay right after the process changes directory
        self.config = cfg
        self._service: SearchService = SearchService(self.path, cfg)
        self._caller = Principal(Role.OPEN)  # in-process: the caller owns the files, every tenant is theirs

    @property
    def version(self) -> str:
        """The store version answers come from (``v000001``, …)."""
        return self._service.cache.version

    def tenants(self) -> list[str]:
        return list(self._service.visible_tenants(self._caller).tenants)

    def strategies(self) -> list[str]:
        return list(self._service.strategy_names)

    def search(self, tenant: str, query: str, *, strategy: str | None = None, k: int | None = None,
               question_time: str | datetime | None = None) -> SearchResponse:
        """What ``POST /v1/search`` answers: ranked nodes (``.results``) with their signals and
        provenance, the source turns (``.turns``) and the packed context (``.context``).
        ``strategy`` and ``k`` default to ``retrieve.default_strategy`` and ``retrieve.k``;
        ``question_time`` (ISO 8601, or a datetime): when the question is asked, which ``auto``
        resolves relative dates against (default: the tenant's latest turn time)."""
        data: dict[str, Any] = {"tenant": tenant, "query": query}
        if strategy is not None:
            data["strategy"] = strategy
        if k is not None:
            data["k"] = k
        if question_time is not None:
            data["question_time"] = question_time.isoformat() if isinstance(question_time, datetime) else question_time
        return self._service.search(self._service.search_request(self._caller, data))

    def session(self, tenant: str, session_id: str, *, around: str | None = None, window: int = 5) -> SessionResponse:
        """A session's turns in order (``around``: a turn's node id or turn id, and ``window``
        turns either side of it)."""
        return self._service.session(self._caller, tenant, session_id, around, window)

    def neighbourhood(self, tenant: str, node: str, *, depth: int = 2, limit: int = 40,
                      structural: bool = False) -> NodeGraphResponse:
        """The memory graph around a node (a node id or a turn id): nodes within ``depth`` edges,
        at most ``limit``, and the edges among them (``structural``: NEXT, IN_SESSION … too)."""
        return self._service.node_graph(self._caller, tenant, node, depth, limit, structural)

    def refresh(self) -> bool:
        """Answer from the newest published version from now on; whether it changed."""
        return self._service.refresh()

    def close(self) -> None:
        self._service.stop()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r}, version={self.version!r})"


def open_store(path: str | Path, *, config: MemlibConfig | str | Path | None = None,
               settings: Mapping[str, Any] | Sequence[str] | None = None) -> Store:
    """Open the store at ``path`` for queries (:class:`Store`). ``config`` and ``settings`` as
    :func:`load_settings`. A path that holds no published store raises
    :class:`~memlib.io.store.StoreError`."""
    from memlib.io.store import StoreError, read_manifest

    if read_manifest(path) is None:
        raise StoreError(f"{path}: not a memlib store (no manifest.json); build one with jobs.api.build or "
                         f"`memlib build`")
    return Store(path, load_settings(config, settings))
