"""What a build does with tenants whose input is bad or forgotten, so that no input problem
removes published memory and no forgotten conversation stays published:

- a tenant some of whose records were quarantined, and whose rebuild would drop turns it has
  published, is kept as published and reported failed (:func:`keep_against_quarantine`);
- a failed tenant whose published version holds a forgotten conversation is removed instead of
  kept (:func:`remove_unkeepable`), and nothing it wrote stays in the new version
  (:func:`drop_partitions`);
- a run refused before any tenant was built leaves no version directory (:func:`discard_if_refused`).
"""
from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from jobs.builder.plan import ForgetList, Plan
from jobs.builder.resume import DONE_DIR
from memlib.io.errors import InputError
from memlib.io.store import StoreError, StoreReader, StoreWriter
from pipelines.shard import TenantShard, staged_rows


@contextmanager
def discard_if_refused(writer: StoreWriter) -> Iterator[None]:
    """An input refused before any tenant was built (unusable, or a deletion above the allowed share)
    leaves no version directory behind: there is nothing in it to resume."""
    try:
        yield
    except (InputError, StoreError):
        if not (writer.version_dir / DONE_DIR).exists():
            shutil.rmtree(writer.version_dir, ignore_errors=True)
        raise


def keep_against_quarantine(writer: StoreWriter, plan: Plan, forget: ForgetList, shards: list[TenantShard]) -> None:
    """A tenant some of whose records were quarantined in this run, and whose rebuild would drop
    turns it has published (not forgotten ones), is kept as published and reported failed: an
    input problem (an export with a broken date format, say) never removes published memory."""
    if writer.base is None:
        return
    counts = Counter(writer.table("quarantine", ["tenant_id"]).column("tenant_id").to_pylist())
    by_id = {s.tenant_id: s for s in shards}
    for tenant, n in sorted(counts.items(), key=lambda x: str(x[0])):
        if tenant in plan.failed or tenant not in plan.build or tenant not in by_id:
            continue
        old = writer.published("turns", tenant, ["node_id", "conversation_id"])
        if old is None:
            continue
        gone_convs = set(forget.conversations_of(tenant))
        published = {nid for nid, conv in zip(old.column("node_id").to_pylist(),
                                              old.column("conversation_id").to_pylist()) if conv not in gone_convs}
        new = set(staged_rows(by_id[tenant].turns_path, tenant, ["node_id"]).column("node_id").to_pylist())
        lost = len(published - new)
        if lost:
            plan.fail(tenant, f"{n} of its records were quarantined, and a rebuild without them would drop {lost} "
                              f"of its {len(published)} published turns: kept as published (fix the records the "
                              f"quarantine table names, or forget conversations with --delete)")


def remove_unkeepable(writer: StoreWriter, plan: Plan, forget: ForgetList, failed: list[str]) -> None:
    """A failed tenant keeps its published data, unless that data holds a conversation on the
    forget list (e.g. the tenant's only conversation was forgotten, so nothing valid is left to
    build): a forgotten conversation never stays published, so the tenant is removed instead."""
    for tenant in failed:
        convs = forget.conversations_of(tenant)
        old = writer.published("turns", tenant, ["conversation_id"]) if convs else None
        if old is None:
            continue
        held = set(old.column("conversation_id").to_pylist())
        held_forgotten = sorted(held & set(convs))
        if not held_forgotten:
            continue
        plan.remove(tenant, f"its published version holds forgotten conversation(s) {', '.join(held_forgotten)} "
                            f"and it could not be rebuilt without them")


def drop_partitions(writer: StoreWriter, tenants: list[str]) -> None:
    """Remove whatever a failed tenant left in the new version (its previous data is linked back)."""
    for tenant in tenants:
        for part in writer.version_dir.glob(f"*/{tenant}.*"):
            if part.is_file():
                part.unlink()


def rebuild_damaged(plan: Plan, published: StoreReader | None) -> None:
    """A tenant to carry over whose published files are gone (a version directory removed by hand,
    a file lost) or not of their published checksum is rebuilt from the input when the input has
    it; otherwise it fails, by name, and the run exits non-zero: a tenant is never carried, and
    published, empty or damaged. A file with the size and mtime it had when its checksum was last
    computed is not hashed again (a stat: damage by a write changes the mtime); the others are
    (docs/decisions/0031-kept-file-checksums.md)."""
    if published is None:
        return
    # a damaged Lance data file (bytes of some tenants' rows): the rows of each tenant to carry are
    # read and checked against their digest; otherwise none is read
    lance = bool(plan.carry) and bool(published.lance_data_damage())
    for tenant in list(plan.carry):
        # files gone, or written since they were hashed and not of the checksum published
        gone = published.missing_files(tenant) or published.damaged_files(tenant, changed_only=True)
        if not gone and lance:
            gone = [str(e) for e in published.lance_damage(tenant)]
        if not gone:
            continue
        plan.carry.remove(tenant)
        if tenant in plan.missing:  # kept from an earlier input: nothing here to rebuild it from
            plan.missing.remove(tenant)
            plan.fail(tenant, f"its published files are gone or damaged ({', '.join(gone[:3])}) and the input "
                              f"does not hold it: build it again from an input that does, or roll back")
        else:
            plan.build.append(tenant)
    plan.build.sort()
