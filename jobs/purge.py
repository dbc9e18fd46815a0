"""Hard deletion of what a store caches outside its tables (part of ``memlib build --compact``)."""
from __future__ import annotations

import shutil
from pathlib import Path


def purge_caches(store: Path) -> dict[str, int]:
    """Hard deletion also covers what the store caches outside its tables: LLM responses not
    referenced by the published ``llm_calls`` (their outputs quote forgotten conversations;
    eval QA answers too), every token matrix of ``auto`` (re-encoded on first use), and every
    kept session output that no published turn belongs to (other build keys entirely). A
    published tenant's matrix reference stays: it names only session keys, and the sessions it
    names are the published ones, which stay (so its first query after compaction reads them
    instead of encoding the tenant again)."""
    from memlib.io.store import LATE_CACHE_SUBDIR, StoreReader
    from pipelines.llm_actors import CACHE_SUBDIR

    llm_dir, late_dir = store / CACHE_SUBDIR, store / LATE_CACHE_SUBDIR
    keep: set[str] = set()
    reader = StoreReader(store)
    calls = reader.table("llm_calls", columns=["cache_key"])
    if calls.num_rows:
        keep = {k for k in calls.column("cache_key").to_pylist() if k}
    removed_llm = kept_llm = removed_late = 0
    if llm_dir.is_dir():
        for f in llm_dir.glob("*/*.json"):
            if f.stem in keep:
                kept_llm += 1
            else:
                f.unlink()
                removed_llm += 1
        for tmp in llm_dir.glob("*/.tmp-*"):
            tmp.unlink(missing_ok=True)
    if late_dir.is_dir():
        from memlib.retrieve.matrix_cache import REFERENCE_SUFFIX, file_tenant

        published = set(reader.tenants())
        for f in late_dir.iterdir():
            if f.is_file() and not (f.name.endswith(REFERENCE_SUFFIX) and file_tenant(f) in published):
                f.unlink()
                removed_late += 1
    return {"llm_cache_removed": removed_llm, "llm_cache_kept": kept_llm, "token_matrices_removed": removed_late,
            **purge_sessions(store, reader)}


def purge_sessions(store: Path, reader) -> dict[str, int]:
    """Keep only the session outputs of the published turns, under the published session build key."""
    from memlib.compose.session_store import SessionStore, other_build_keys
    from memlib.compose.sessions import session_keys

    skey = reader.manifest.get("session_build_key")
    stale = other_build_keys(store, skey or "")
    for d in stale:
        shutil.rmtree(d, ignore_errors=True)
    out = {"session_key_dirs_removed": len(stale)}
    if skey:
        live: set[str] = set()
        for tenant in reader.tenants():
            turns = reader.table("turns", tenant)
            if turns.num_rows:
                live.update(session_keys(turns, skey).to_pylist())
        kept = SessionStore(store, skey)
        out.update(kept.retain(live, rewrite=True))
        out.update(kept.upgrade())  # blocks kept by older versions get the layout a build writes now
    return out
