"""Store maintenance: compaction (hard deletion of every unpublished version) and rollback to an
earlier published version (``memlib build --compact`` / ``--rollback``)."""
from __future__ import annotations

import json
import re
import shutil
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

from jobs.builder.lock import locked
from jobs.purge import purge_caches
from memlib import schema
from memlib.io.errors import InputError
from memlib.io.lance_checks import LANCE_DATA_KEY, LANCE_FILES_KEY
from memlib.io.lance_tables import LanceTables
from memlib.io.store import MANIFEST, StoreError, atomic_write_json, read_manifest, version_name


def rollback(store: str | Path, version: str) -> dict[str, Any]:
    """Publish an earlier manifest again (its Lance version and Parquet files are kept)."""
    store = Path(store)
    src = store / "manifests" / f"{version}.json"
    if not src.exists():
        known = sorted(p.stem for p in (store / "manifests").glob("v*.json"))
        raise StoreError(f"no published version {version!r} in {store}; known: {', '.join(known) or 'none'}")
    data = json.loads(src.read_text(encoding="utf-8"))
    if not (store / "versions" / version).exists():
        raise StoreError(f"version {version} was published but its files are gone")
    atomic_write_json(store / MANIFEST, data)
    return data


def _lance_writer(store: Path, dim: int) -> LanceTables:
    """The store's Lance tables, opened without starting a new version directory."""
    w = LanceTables()
    w.path, w.dim = store, dim
    return w


@locked("store")
def compact(store: str | Path) -> dict[str, Any]:
    """Hard deletion: keep only the published version (Lance old versions, version dirs, manifests)."""
    store = Path(store)
    manifest = read_manifest(store)
    if manifest is None:
        raise InputError(store, "not a memlib store (no manifest.json)")
    w = _lance_writer(store, int(manifest.get("embedding_dim", schema.DEFAULT_EMBED_DIM)))
    w.restore_published(manifest)
    stats = {"lance_versions_before": len(w.open_nodes().list_versions())}
    for key, tbl in w.lance_tables().items():
        with warnings.catch_warnings():  # the warning is the point: every older version goes
            warnings.simplefilter("ignore", UserWarning)
            tbl.optimize(cleanup_older_than=timedelta(0), delete_unverified=True)
        manifest[key] = tbl.version
    manifest[LANCE_FILES_KEY] = w.lance_files(manifest.get(LANCE_FILES_KEY))  # the compacted versions' files
    manifest[LANCE_DATA_KEY] = w.lance_data(manifest.get(LANCE_DATA_KEY))
    removed = []
    for d in sorted((store / "versions").iterdir()):
        if d.name != manifest["version"]:
            shutil.rmtree(d)
            removed.append(d.name)
    for m in sorted((store / "manifests").glob("v*.json")):
        if m.stem != manifest["version"]:
            m.unlink()
    atomic_write_json(store / "manifests" / f"{manifest['version']}.json", manifest)
    atomic_write_json(store / "manifest.json", manifest)
    stats.update(lance_versions_after=len(w.open_nodes().list_versions()), removed_versions=removed,
                 version=manifest["version"], lance_version=manifest["lance_version"],
                 **purge_caches(store))
    return stats


@locked("store")
def rollback_store(store: str | Path, version: str) -> dict[str, Any]:
    """Publish an earlier version again; Lance is restored to its rows so later builds start from them."""
    if not re.fullmatch(r"v?\d{1,6}", version):
        raise StoreError(f"version {version!r} is not a version name (v000003, or 3)")
    data = rollback(store, version if version.startswith("v") else version_name(int(version)))
    _lance_writer(Path(store), int(data.get("embedding_dim", schema.DEFAULT_EMBED_DIM))).restore_published(data)
    return data
