"""Planning of a build: what to rebuild, carry over, resume, forget or report failed.

No Ray here; :mod:`jobs.builder.driver` executes the plan. A tenant is rebuilt when its input
hash changed, when the build key changed (:func:`memlib.compose.keys.build_key`: config sections
that affect the output, prompt hashes, recipe), or when it failed last time; otherwise it is
carried over untouched (Parquet files hard-linked, Lance rows left in place, no embedding or LLM
work).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from memlib.config import MemlibConfig
from memlib.io.errors import InputError
from memlib.io.readers import input_fingerprints
from memlib.io.validate import validate_tenant_id


class TenantStatus(str, Enum):
    BUILT = "built"          # rebuilt in this version
    RESUMED = "resumed"      # finished by an interrupted run of this version, not recomputed
    CARRIED = "carried"      # unchanged, carried over from the published version
    FAILED = "failed"        # this run failed; the previous published data (if any) is kept


@dataclass
class ForgetList:
    """Tenants and (tenant, conversation) pairs to forget: they never reach a published table."""
    tenants: set[str] = field(default_factory=set)
    conversations: set[tuple[str, str]] = field(default_factory=set)

    @classmethod
    def parse(cls, text: str, source: str = "forget list") -> ForgetList:
        """``tenant`` or ``tenant/conversation`` per line, ``#`` comments. A line that names no valid
        tenant, or a tenant followed by ``/`` and no conversation, is an error: a typo must never
        forget a whole tenant, nor silently nothing."""
        out = cls()
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            tenant, slash, conv = (p.strip() for p in line.partition("/"))
            problem = validate_tenant_id(tenant)
            if problem is None and slash and not conv:
                problem = "a '/' with no conversation id after it"
            if problem is not None:
                raise InputError(source, f"line {n}: {line[:80]!r}: {problem}")
            if conv:
                out.conversations.add((tenant, conv))
            else:
                out.tenants.add(tenant)
        return out

    @classmethod
    def load(cls, path: str | Path | None, previous: dict[str, Any] | None = None) -> ForgetList:
        """The deletion file merged with the list persisted in the published manifest."""
        out = cls.parse(_forget_text(Path(path)), str(path)) if path else cls()
        prev = previous or {}
        out.tenants |= set(prev.get("tenants", []))
        out.conversations |= {tuple(c.split("/", 1)) for c in prev.get("conversations", [])}
        return out

    def to_json(self) -> dict[str, list[str]]:
        return {"tenants": sorted(self.tenants), "conversations": sorted(f"{t}/{c}" for t, c in self.conversations)}

    def conversations_of(self, tenant: str) -> list[str]:
        return sorted(c for t, c in self.conversations if t == tenant)

    def keep_rows(self, table: pa.Table) -> pa.Table:
        """``table`` without rows of forgotten tenants or conversations (vectorized)."""
        if table.num_rows == 0 or (not self.tenants and not self.conversations):
            return table
        tenant = table.column("tenant_id")
        drop = pc.fill_null(pc.is_in(tenant, pa.array(sorted(self.tenants), pa.string())), False)
        if self.conversations and "conversation_id" in table.column_names:
            key = pc.binary_join_element_wise(pc.fill_null(tenant, ""),
                                              pc.fill_null(table.column("conversation_id"), ""), "/")
            pairs = pa.array(sorted(f"{t}/{c}" for t, c in self.conversations), pa.string())
            drop = pc.or_(drop, pc.fill_null(pc.is_in(key, pairs), False))
        return table.filter(pc.invert(drop))


def _forget_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(path, "forget list not found") from None
    except OSError as exc:
        raise InputError(path, f"forget list unreadable: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(path, "forget list is not UTF-8 text (UTF-16? convert it first)") from None


def effective_hash(input_hash: str, forget: ForgetList, tenant: str) -> str:
    """The input hash of a tenant after forgetting some of its conversations."""
    convs = forget.conversations_of(tenant)
    if not convs:
        return input_hash
    return hashlib.sha256((input_hash + "|" + "|".join(convs)).encode("utf-8")).hexdigest()


@dataclass
class Plan:
    """Every tenant's fate in this run, and the one ledger of its outcomes: a failure is recorded
    with :meth:`fail`, a failed tenant turned into a removed one with :meth:`remove`."""
    build: list[str] = field(default_factory=list)
    carry: list[str] = field(default_factory=list)
    resume: dict[str, dict[str, Any]] = field(default_factory=dict)   # tenant -> its completion marker
    gone: list[str] = field(default_factory=list)                      # published before, not any more
    failed: dict[str, str] = field(default_factory=dict)               # tenant -> reason
    hashes: dict[str, str] = field(default_factory=dict)
    sources: dict[str, Any] = field(default_factory=dict)              # tenant -> input file name(s)
    missing: list[str] = field(default_factory=list)                   # absent from the input, kept (carried)
    removed: dict[str, str] = field(default_factory=dict)              # tenant -> why it was removed, not kept

    def fail(self, tenant: str, reason: str) -> None:
        """``tenant`` failed in this run (its published data, if any, is kept), for ``reason``."""
        self.failed[tenant] = reason

    def remove(self, tenant: str, why: str) -> None:
        """A failed tenant whose published data cannot be kept is removed instead: deleted from the
        version, with ``why`` and its failure as the reason."""
        reason = self.failed.pop(tenant)
        self.gone.append(tenant)
        self.removed[tenant] = f"{why} ({reason}): removed, not kept"

    def changes_nothing(self, base: dict[str, Any] | None, forget: ForgetList) -> bool:
        """Whether publishing this plan would give the published version again: nothing built,
        resumed, deleted or failed, every published tenant carried, from the same input (hash and
        source) or kept while missing from it (a nightly input of only the day's tenants), and
        the same forget list. Such a run publishes no new version."""
        if not base or self.build or self.resume or self.gone or self.failed or self.removed:
            return False
        published = base.get("tenants", {})
        same_forget = forget.to_json() == ForgetList.load(None, base.get("forgotten")).to_json()
        if set(self.carry) != set(published) or not same_forget:
            return False
        missing = set(self.missing)
        return all(e.get("status") != TenantStatus.FAILED.value and (t in missing or (
            self.hashes.get(t) == e.get("input_hash") and self.sources.get(t) == e.get("source")))
            for t, e in published.items())

    def to_json(self) -> dict[str, Any]:
        out = {"built": sorted(t for t in self.build if t not in self.failed), "carried": sorted(self.carry),
               "resumed": sorted(self.resume), "deleted": sorted(self.gone),
               "failed": dict(sorted(self.failed.items())), "missing_kept": sorted(self.missing)}
        if self.removed:
            out["removed"] = dict(sorted(self.removed.items()))
        return out


def make_plan(base: dict[str, Any] | None, hashes: dict[str, str], sources: dict[str, str], key: str,
              done: dict[str, dict[str, Any]], failed_sources: dict[str, str]) -> Plan:
    """Decide every tenant's fate. ``hashes``: effective input hash of every tenant read;
    ``done``: completion markers of an interrupted run; ``failed_sources``: unreadable files."""
    base = base or {}
    prev = base.get("tenants", {})
    same_key = base.get("build_key") == key
    plan = Plan(hashes=dict(hashes), sources=dict(sources))
    for tenant, h in sorted(hashes.items()):
        old = prev.get(tenant)
        marker = done.get(tenant)
        if (old and same_key and old.get("input_hash") == h
                and old.get("status", TenantStatus.BUILT.value) != TenantStatus.FAILED.value):
            plan.carry.append(tenant)
        elif marker and marker.get("input_hash") == h and marker.get("build_key") == key:
            plan.resume[tenant] = marker
        else:
            plan.build.append(tenant)
    for tenant, old in sorted(prev.items()):
        bad = [s for s in source_names(old.get("source")) if s in failed_sources]
        if bad:  # read from a file that failed now: its data is incomplete, keep the published one
            plan.fail(tenant, f"input file {bad[0]} unreadable: {failed_sources[bad[0]]}")
            plan.build = [t for t in plan.build if t != tenant]
            plan.carry = [t for t in plan.carry if t != tenant]
            plan.resume.pop(tenant, None)
        elif tenant not in hashes:
            plan.gone.append(tenant)
    return plan


def source_names(value: Any) -> list[str]:
    """A manifest's ``source`` of a tenant: one file name, or a list when it spans several files."""
    if isinstance(value, list):
        return [str(v) for v in value]
    return [value] if isinstance(value, str) else []


@dataclass
class SourceRead:
    """What the first pass over the input files found."""
    hashes: dict[str, str] = field(default_factory=dict)          # tenant -> effective input hash
    sources: dict[str, Any] = field(default_factory=dict)         # tenant -> file name (list: several)
    failed: dict[str, str] = field(default_factory=dict)          # file name -> why it is unreadable
    tenants_read: set[str] = field(default_factory=set)           # every valid tenant seen, forgotten ones too


def fingerprint_sources(sources: list[Path], fmt: str, cfg: MemlibConfig, forget: ForgetList) -> SourceRead:
    """Input hash of every tenant over every file. A tenant found in several files is one tenant:
    its hash covers each file's records (in file order) and every file is named as its source."""
    out, per_tenant = SourceRead(), {}
    for src in sources:
        try:
            fps = input_fingerprints(src, fmt, cfg.io)
        except (InputError, OSError, ValueError) as exc:
            out.failed[src.name] = str(exc)[:300]
            continue
        for tenant, h in fps.items():
            if validate_tenant_id(tenant) is not None:
                continue
            out.tenants_read.add(tenant)
            if tenant not in forget.tenants:
                per_tenant.setdefault(tenant, []).append((src.name, h))
    for tenant, found in per_tenant.items():
        h = found[0][1] if len(found) == 1 else hashlib.sha256(
            "|".join(f"{name}:{fh}" for name, fh in found).encode("utf-8")).hexdigest()
        out.hashes[tenant] = effective_hash(h, forget, tenant)
        out.sources[tenant] = found[0][0] if len(found) == 1 else [name for name, _ in found]
    return out


def check_readable(input_path: Any, sources: list[Path], read: SourceRead, *, full: bool) -> None:
    """Stop the build (nothing published) when the input is unusable: no input file, an unreadable
    file in a full build or as the only file, or no record with a valid tenant anywhere."""
    if not sources:
        raise InputError(input_path, "no input file (an empty directory, or no file with the format's suffix)")
    if read.failed and (full or len(sources) == 1 or len(read.failed) == len(sources)):
        name, reason = next(iter(read.failed.items()))
        path, _, rest = reason.partition(": ")  # the reader's message names the file already
        raise InputError(path, rest) if rest and Path(path).name == name else InputError(name, reason)
    if not read.tenants_read:
        raise InputError(input_path, "no record with a valid tenant_id in the input: nothing to build")


class RemovalRefused(InputError):
    """A build would delete more published tenants than ``nightly.max_removed_share`` allows."""


def settle_missing(plan: Plan, base: dict[str, Any] | None, forgotten: set[str], *, complete: bool,
                   max_share: float) -> None:
    """Published tenants missing from the input (not forgotten, not failed) are kept as published
    unless the input is complete; a complete input may delete at most ``max_share`` of them."""
    prev = (base or {}).get("tenants", {})
    missing = sorted(t for t in prev if t not in plan.hashes and t not in plan.failed and t not in forgotten)
    plan.gone = [t for t in plan.gone if t in forgotten]
    if not missing:
        return
    if not complete:
        for tenant in missing:
            plan.carry.append(tenant)
            plan.missing.append(tenant)
            plan.hashes[tenant] = prev[tenant].get("input_hash")
            plan.sources[tenant] = prev[tenant].get("source")
        plan.carry.sort()
        return
    share = len(missing) / len(prev)
    if share > max_share:
        raise RemovalRefused("input", f"it would delete {len(missing)} of {len(prev)} published tenants "
                                      f"({share:.0%}) missing from it, more than nightly.max_removed_share="
                                      f"{max_share:g}; delete them with --delete FILE, or raise --max-removed-share")
    plan.gone = sorted(set(plan.gone) | set(missing))
