"""Forgetting from a published store without its input (``memlib build --delete FILE --out STORE``).

A tenant listed whole needs no input: it is dropped from the next version. A tenant with a
forgotten conversation must be rebuilt without it; with no input given, it is rebuilt from the
store's own published records: its turns and questions are written out in the generic JSONL format
and the run is an incremental build of that file, so every other tenant is carried over untouched.
The rebuilt tenant's input hash is then that of the exported records, not of the original input:
the next nightly run with the original input rebuilds it once more (same turns, same result).
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobs.builder.plan import ForgetList
from memlib.io.errors import InputError
from memlib.io.store import StoreError, StoreReader, read_manifest

TURN_FIELDS = ("tenant_id", "conversation_id", "session_id", "session_time", "turn_id", "speaker", "role", "text",
               "extras")
QUESTION_FIELDS = ("tenant_id", "question_id", "question", "answer", "category", "evidence", "evidence_sessions",
                   "question_time")


def _iso(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


def _turn_records(reader: StoreReader, tenant: str, whole: bool) -> Iterator[dict[str, Any]]:
    table = reader.table("turns", tenant)
    if table.num_rows == 0:
        return
    rows = sorted(table.to_pylist(), key=lambda r: (r["conversation_id"], r["session_index"], r["turn_index"]))
    for row in rows[:1] if whole else rows:  # a tenant forgotten whole: one record names it in the input
        rec = {k: _iso(row.get(k)) for k in TURN_FIELDS if row.get(k) is not None}
        if isinstance(rec.get("extras"), str):
            rec["extras"] = json.loads(rec["extras"]) if rec["extras"].strip() else {}
        yield rec


def _question_records(reader: StoreReader, tenant: str) -> Iterator[dict[str, Any]]:
    for row in reader.table("questions", tenant).to_pylist():
        yield {"kind": "question", **{k: _iso(row.get(k)) for k in QUESTION_FIELDS if row.get(k) is not None}}


def published_input(out: str | Path, delete: str | Path, dest: Path) -> Path:
    """Write the published records of the tenants ``delete`` names to ``dest`` (JSONL), so an
    incremental build of it with the forget list forgets them: every turn and question of a tenant
    with a forgotten conversation, one turn of a tenant forgotten whole."""
    if read_manifest(out) is None:
        raise StoreError(f"{out}: not a memlib store (no manifest.json): --delete without --input forgets from "
                         f"a published store; pass --input to build one")
    forget = ForgetList.load(delete)
    reader = StoreReader(out)
    whole = {t for t in forget.tenants if reader.has_tenant(t)}
    partial = {t for t, _ in forget.conversations if reader.has_tenant(t) and t not in forget.tenants}
    if not whole and not partial:
        named = sorted(forget.tenants | {t for t, _ in forget.conversations})
        raise InputError(delete, f"no tenant it names is in the published store {out} "
                                 f"({', '.join(named[:5]) or 'it names none'}): nothing to forget")
    with dest.open("w", encoding="utf-8") as fh:
        for tenant in sorted(whole | partial):
            records = list(_turn_records(reader, tenant, tenant in whole))
            if tenant in partial:
                records += list(_question_records(reader, tenant))
            fh.writelines(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in records)
    return dest
