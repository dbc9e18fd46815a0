"""A synthetic enterprise for ``memlib bench tenants``: many small tenants made from real sessions.

Every session of the given conversation files (LoCoMo, LongMemEval) becomes a template; tenant
``i`` takes template ``i mod S`` (cut to ``turns_per_tenant`` turns, or whole and several of them
with ``mix``), under its own tenant id and with its dates moved by a per-tenant number of days,
so no two tenants share a build. Nightly inputs give chosen tenants one more session (another
template, dated a day after the tenant's latest) and hold just those tenants' whole records: a
nightly input names what changed, and every tenant missing from it is carried over.
Written as the generic JSONL format (one turn per line).
"""
from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from memlib.config import IOConfig
from memlib.io.readers import iter_tenants

_FIELDS = ("conversation_id", "session_id", "speaker", "role", "text")


@dataclass
class Enterprise:
    """Tenant id -> its turns (generic JSONL records, in order)."""
    tenants: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def turns(self) -> int:
        return sum(len(t) for t in self.tenants.values())

    def write(self, path: Path, tenants: Iterable[str] | None = None) -> Path:
        """The records of ``tenants`` (default: all) as one JSONL file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as fh:
            for tenant in (self.tenants if tenants is None else tenants):
                for rec in self.tenants[tenant]:
                    fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        return path


def session_templates(paths: Iterable[tuple[Path, str]]) -> list[list[dict[str, Any]]]:
    """Every session of the files (path, format) as a list of turns with their time, in file order."""
    out: list[list[dict[str, Any]]] = []
    for path, fmt in paths:
        for result in iter_tenants(path, fmt, IOConfig()):
            rows = result.turns.select(["conversation_id", "session_id", "session_time", "turn_index", "speaker",
                                        "role", "text"]).to_pylist()
            by_session: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for r in rows:
                by_session.setdefault((r["conversation_id"], r["session_id"]), []).append(r)
            for turns in by_session.values():
                out.append(sorted(turns, key=lambda r: r["turn_index"]))
    if not out:
        raise ValueError("no session in the template files")
    return out


def _records(tenant: str, session: list[dict[str, Any]], sid: str, when: datetime, cap: int | None,
             ) -> list[dict[str, Any]]:
    turns = session[:cap] if cap else session
    return [{"tenant_id": tenant, "conversation_id": f"{tenant}-c", "session_id": sid,
             "session_time": when.isoformat(), "turn_id": f"{sid}:{i + 1}", "speaker": t["speaker"],
             "role": t["role"], "text": t["text"]} for i, t in enumerate(turns)]


def _when(template: list[dict[str, Any]], shift_days: int) -> datetime:
    base = template[0]["session_time"] or datetime(2024, 1, 1)
    return base + timedelta(days=shift_days)


def make_enterprise(templates: list[list[dict[str, Any]]], n_tenants: int, max_turns: int | None = None, *,
                    mix: bool = False, seed: int = 0) -> Enterprise:
    """``n_tenants`` tenants from ``templates``. Without ``mix``, one session each, cut to
    ``max_turns // n_tenants`` turns (whole sessions when ``max_turns`` is None). With ``mix``,
    tenant sizes follow a Zipf law (1 to 50 whole sessions each, most tenants one), cut so the
    total stays within ``max_turns`` (but every tenant keeps at least one turn)."""
    rng = random.Random(seed)
    cap = max(1, max_turns // n_tenants) if max_turns and not mix else None
    ent, total, s = Enterprise(), 0, len(templates)
    for i in range(n_tenants):
        tenant = f"u{i:07d}"
        shift = rng.randrange(0, 730)
        n_sessions = min(50, int(rng.paretovariate(1.2))) if mix else 1
        recs: list[dict[str, Any]] = []
        for j in range(n_sessions):
            tpl = templates[(i + j * 7919) % s]
            recs += _records(tenant, tpl, f"s{j + 1}", _when(tpl, shift) + timedelta(days=j), cap)
        if mix and max_turns and total + len(recs) > max_turns and ent.tenants:
            recs = recs[:max(1, max_turns - total)] if total < max_turns else recs[:1]
        ent.tenants[tenant] = recs
        total += len(recs)
    return ent


def with_new_session(ent: Enterprise, templates: list[list[dict[str, Any]]], tenants: Iterable[str],
                     cap: int | None, tag: str = "n1") -> Enterprise:
    """A copy of ``ent`` in which each of ``tenants`` has one more session, dated a day after its
    latest, taken from a template its other sessions do not use."""
    out = Enterprise({t: list(recs) for t, recs in ent.tenants.items()})
    for k, tenant in enumerate(tenants):
        recs = out.tenants[tenant]
        latest = max(datetime.fromisoformat(r["session_time"]) for r in recs)
        tpl = templates[(int(tenant[1:]) * 31 + 104_729 + k) % len(templates)]
        out.tenants[tenant] = recs + _records(tenant, tpl, tag, latest + timedelta(days=1), cap)
    return out


def pick(tenants: list[str], share: float, seed: int = 1) -> list[str]:
    """``share`` of ``tenants`` (at least one), chosen at random."""
    n = max(1, round(len(tenants) * share))
    return sorted(random.Random(seed).sample(tenants, min(n, len(tenants))))


def regroup(ent: Enterprise, groups: int) -> Enterprise:
    """The same turns as ``groups`` tenants (for the per-turn baseline): tenant k's sessions go to
    group k mod ``groups`` as a conversation of their own."""
    out = Enterprise()
    for k, (tenant, recs) in enumerate(ent.tenants.items()):
        g = f"g{k % groups:03d}"
        out.tenants.setdefault(g, []).extend(
            {**r, "tenant_id": g, "conversation_id": f"{tenant}-c"} for r in recs)
    return out


def iter_files(paths: Iterable[str]) -> Iterator[tuple[Path, str]]:
    """(path, format) of each template file: LongMemEval when its name says so, else LoCoMo."""
    for p in paths:
        path = Path(p)
        yield path, ("longmemeval" if "longmemeval" in path.name else "locomo")
