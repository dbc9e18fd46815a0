"""A store version directory that survives an interrupted build: its tenants' completion markers
and outputs are kept, so the next run resumes instead of rebuilding them (jobs/builder/driver.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from memlib.io.store import StoreWriter, atomic_write_json, read_manifest

DONE_DIR = "_done"


class ResumableWriter(StoreWriter):
    """A StoreWriter that keeps the completion markers and outputs of an interrupted build."""

    def __init__(self, path: str | Path, *, dim: int):
        path = Path(path)
        stash = _stash_pending(path)
        super().__init__(path, dim=dim)
        if stash is not None:
            self.version_dir.rmdir()
            stash.rename(self.version_dir)

    def done_markers(self) -> dict[str, dict[str, Any]]:
        d = self.version_dir / DONE_DIR
        out = {}
        for p in sorted(d.glob("*.json")) if d.exists() else []:
            marker = json.loads(p.read_text(encoding="utf-8"))
            if Path(marker["summary"]["nodes_path"]).exists():
                out[p.stem] = marker
        return out

    def mark_done(self, tenant: str, marker: dict[str, Any]) -> None:
        atomic_write_json(self.version_dir / DONE_DIR / f"{tenant}.json", marker)


def _stash_pending(path: Path) -> Path | None:
    """Move an unpublished version directory with completion markers aside (StoreWriter clears it)."""
    manifest = read_manifest(path)
    published = int(manifest["version"][1:]) if manifest else 0
    versions = sorted(p for p in (path / "versions").glob("v*") if p.is_dir()) if (path / "versions").exists() else []
    pending = [p for p in versions if int(p.name[1:]) > published and (p / DONE_DIR).exists()]
    if not pending:
        return None
    stash = path / "versions" / f".resume-{pending[-1].name}"
    if stash.exists():
        shutil.rmtree(stash)
    pending[-1].rename(stash)
    return stash
