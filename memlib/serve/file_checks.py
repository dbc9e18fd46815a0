"""What the service checks of a tenant's files before it trusts them, and the background check that
goes through a served version's tenants in slices (docs/decisions/0031-kept-file-checksums.md)."""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from memlib.io.checksums import GRAPH, LANCE, MEMORY_VIEW, DamagedFileError
from memlib.retrieve.matrix_cache import damaged_tenants

log = logging.getLogger("memlib.serve")
FILES_UNREADABLE = "files unreadable"
GRAPH_UNREADABLE = "graph file unreadable"  # only the strategies that read the graph are refused
LANCE_UNREADABLE = "lance rows damaged"  # only the strategies that read Lance are refused
PARTIAL = {GRAPH: GRAPH_UNREADABLE, LANCE: LANCE_UNREADABLE}  # DamagedFileError.part -> what is refused
CHECK_DUTY = 0.1  # share of one core the background check of a version's files may take


def usable_damage(damaged: list[DamagedFileError]) -> list[DamagedFileError]:
    """The damage that stops a tenant's strategies: a damaged memory view is not (its checksum is checked
    again where it is read, and its tenant's memory signals read Lance and the graph file instead,
    docs/decisions/0036-memory-view.md); ``memlib verify`` still names it and a nightly rebuilds it."""
    return [d for d in damaged if d.part != MEMORY_VIEW]


def graph_only(damaged: list[DamagedFileError]) -> bool:
    """Whether every damaged file is of the tenant's graph (``part``): the rest of the tenant serves."""
    return bool(damaged) and all(d.part == GRAPH for d in damaged)


def tenant_damage(reader: Any, tenant: str, loaded: bool = False) -> DamagedFileError | None:
    """What is damaged of ``tenant``'s published files, the kept blocks its matrix refers to and its
    Lance rows (``part`` says what of it; None: nothing). ``loaded``: its files were checked as it
    loaded; only its Lance rows are left (read by the strategies that read Lance, on first use)."""
    files = [] if loaded else usable_damage(reader.damage(tenant))
    if files and not graph_only(files):
        return DamagedFileError(f"published files damaged: {', '.join(map(str, files[:3]))}")
    kept = None if loaded else damaged_tenants(reader, [tenant]).get(tenant)
    if kept:
        return DamagedFileError(kept)
    if files:
        return DamagedFileError(", ".join(map(str, files[:3])), part=GRAPH)
    for name in ("nodes", "turn_text"):
        try:
            reader.check_lance_rows(tenant, name)
        except DamagedFileError as exc:
            return exc
    return None


def check_in_slices(svc: Any, reader: Any) -> threading.Thread:
    """Check ``reader``'s version tenant by tenant on a thread, taking at most ``CHECK_DUTY`` of a core
    (each file hashed once in this process): start-up hashes nothing, a tenant with a damaged file
    is reported broken (``svc._broken``) before it is asked for, and a cold query mostly finds its
    files checked already (one ``stat`` each then). A tenant loaded before the thread reaches it
    had its files checked as it loaded (``SearchService.index``): only its Lance rows are. The thread ends when
    ``svc._stopped`` is set or another version is served; ``svc.checked_version`` names the version
    it went through."""
    version = reader.version

    def run() -> None:
        try:  # below the request threads: on Linux a thread has a priority of its own
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        for tenant in reader.tenants():
            if svc._stopped.is_set() or svc.cache.version != version:
                return
            if tenant in svc.broken:
                continue
            t0 = time.perf_counter()
            try:
                found = tenant_damage(reader, tenant, loaded=tenant in svc.cache)
            except Exception:  # noqa: BLE001 - a query still checks the files it reads
                log.exception("checking tenant %s of store version %s failed", tenant, version)
                found = None
            if found is not None and svc.cache.version == version and svc.cache.has_tenant(tenant):
                svc._broken(tenant, PARTIAL.get(found.part, FILES_UNREADABLE), found)
            svc._stopped.wait((time.perf_counter() - t0) * (1 / CHECK_DUTY - 1))
        svc.checked_version = version

    thread = threading.Thread(target=run, name="memlib-check-kept", daemon=True)
    thread.start()
    return thread
