"""The build manifest: config snapshot, input hashes, row counts, stage timings, versions."""
from __future__ import annotations

import subprocess
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from memlib.config import MemlibConfig

REPO = Path(__file__).resolve().parents[2]


def memlib_version() -> str:
    try:
        return version("memlib")
    except PackageNotFoundError:
        return "unknown"


def git_sha(repo: Path = REPO) -> str | None:
    """The commit the code was built from (None outside a git checkout)."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


# per-tenant counts a version keeps besides the manifest's totals (STORE/versions/vN/tenant_counts.parquet,
# memlib.io.store): a run that carries a tenant takes them from there (jobs/builder/counts.py)
TENANT_COUNTS = ("nodes_by_kind", "edges_by_kind", "questions")


def sum_counts(summaries: list[dict[str, Any]], key: str) -> dict[str, int]:
    total: Counter[str] = Counter()
    for s in summaries:
        total.update(s.get(key, {}))
    return dict(sorted(total.items()))


@dataclass(frozen=True)
class VersionFacts:
    """What a version was built from and what its run measured, besides its tenants' summaries."""
    input_path: str
    fmt: str
    fingerprints: dict[str, str]
    questions: int
    quarantine_by_reason: dict[str, int]
    timings: dict[str, float]
    graph: dict[str, Any]


def build_manifest(cfg: MemlibConfig, recipe: str, summaries: list[dict[str, Any]],
                   facts: VersionFacts) -> dict[str, Any]:
    by_tenant = {s["tenant_id"]: s for s in summaries}
    return {
        "created_at": datetime.now(timezone.utc).isoformat(),
        "memlib_version": memlib_version(),
        "git_sha": git_sha(),
        "recipe": recipe,
        "input": {"path": str(facts.input_path), "format": facts.fmt},
        "config": cfg.snapshot(),
        "tenants": {t: {"input_hash": facts.fingerprints.get(t), "turns": s["turns"], "nodes": s["nodes"],
                        "edges": s["edges"], "segments": s["segments"],
                        # what the store-wide counts sum, so that a nightly run adds up what it
                        # rebuilt and what it carried instead of reading every part back
                        **{k: s[k] for k in TENANT_COUNTS if k in s},
                        # derived node texts the build encoded (a backend that embeds facts by their own text)
                        **({"own_encoded": s["own_encoded"]} if "own_encoded" in s else {}),
                        # its Lance rows' checksum (memlib/io/lance_checks.py)
                        **({"lance_digest": s["lance_digest"]} if "lance_digest" in s else {})}
                    for t, s in sorted(by_tenant.items())},
        "row_counts": {
            "turns": sum(s["turns"] for s in summaries),
            "nodes": sum(s["nodes"] for s in summaries),
            "edges": sum(s["edges"] for s in summaries),
            "segments": sum(s["segments"] for s in summaries),
            "questions": facts.questions,
            "quarantine": sum(facts.quarantine_by_reason.values()),
        },
        "nodes_by_kind": sum_counts(summaries, "nodes_by_kind"),
        "edges_by_kind": sum_counts(summaries, "edges_by_kind"),
        "dropped_edges_by_kind": sum_counts(summaries, "dropped_by_kind"),
        "quarantine_by_reason": facts.quarantine_by_reason,
        "stage_timings_s": facts.timings,
        "tenant_stage_timings_s": {k: round(v, 3) for k, v in _sum_timings(summaries).items()},
        "graph": facts.graph,
        "llm_calls": sum_counts(summaries, "llm"),  # calls, ok/cached/error, tokens (empty: no LLM stage)
    }


def _sum_timings(summaries: list[dict[str, Any]]) -> dict[str, float]:
    total: Counter[str] = Counter()
    for s in summaries:
        total.update(s.get("timings", {}))
    return dict(total)
