"""``memlib verify``: what fsck is to a file system. Every file the published manifest names is read
and decoded, every tenant checked for its rows, edges and graph, every kept file against the
checksum written with it; one line per problem, each with the command that repairs it. The checks
are the ones ``memlib inspect --store`` (:func:`jobs.cli.inspect_store.tenant_problem`), the build
(:meth:`StoreReader.missing_files`) and the service (:func:`memlib.retrieve.matrix_cache.damaged_tenants`)
make."""
from __future__ import annotations

import json
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from jobs.cli.inspect_store import tenant_problem
from memlib.compose.session_store import SESSIONS_SUBDIR, SessionStore
from memlib.io.checksums import DamagedFileError
from memlib.io.reader_checks import LANCE_TABLES
from memlib.io.store import LATE_CACHE_SUBDIR, StoreReader, read_tenant
from memlib.retrieve.matrix_cache import damaged_tenants, tenant_references


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    damaged: list[Path] = field(default_factory=list)  # kept files and blocks --drop-damaged removes
    checked: Counter = field(default_factory=Counter)


def _rebuild(store: Path, tenant: str, earlier: list[str]) -> str:
    back = f", or roll back: memlib build --out {store} --rollback {earlier[-1]}" if earlier else ""
    return f"rebuild it: memlib build --incremental --input INPUT --out {store} (an INPUT holding {tenant}){back}"


def _tenants(reader: StoreReader, report: Report, earlier: list[str]) -> None:
    nodes = _node_counts(reader, report)
    for tenant in reader.tenants():
        entry = reader.manifest["tenants"].get(tenant) or {}
        report.checked["tenants"] += 1
        gone = reader.missing_files(tenant)
        problem = f"files missing: {', '.join(gone[:3])}" if gone else tenant_problem(reader, tenant)
        if problem is None:
            problem = _counts_problem(reader, tenant, entry, nodes)
        if problem is not None:
            report.problems.append(f"tenant {tenant}: {problem}; {_rebuild(reader.path, tenant, earlier)}")


def _lance_files(reader: StoreReader, report: Report, earlier: list[str]) -> None:
    """The index and manifest files of the published Lance versions against their checksums."""
    for name in LANCE_TABLES:
        report.checked["lance tables"] += 1
        try:
            reader.check_lance_files(name)
        except DamagedFileError as exc:
            back = f", or roll back: memlib build --out {reader.path} --rollback {earlier[-1]}" if earlier else ""
            report.problems.append(f"lance {name} table: {exc}; index it again: memlib build --incremental --input "
                                   f"INPUT --out {reader.path} (a run indexes a table whose index files are "
                                   f"damaged anew){back}")


def _node_counts(reader: StoreReader, report: Report) -> dict[str, int] | None:
    try:
        table = reader.nodes(columns=["tenant_id"])
    except Exception as exc:  # noqa: BLE001 - Lance raises errors of many kinds
        report.problems.append(f"lance nodes table unreadable: {' '.join(str(exc).split())[:160]}; roll back: "
                               f"memlib build --out {reader.path} --rollback VERSION")
        return None
    counts = pc.value_counts(table.column("tenant_id")).to_pylist() if table.num_rows else []
    return {c["values"]: c["counts"] for c in counts}


def _counts_problem(reader: StoreReader, tenant: str, entry: dict, nodes: dict[str, int] | None) -> str | None:
    for name in ("turns", "edges"):
        want = entry.get(name)
        if want is None:
            continue
        got = read_tenant(reader.table_file(name, tenant), tenant, ["tenant_id"]).num_rows \
            if reader.table_file(name, tenant).exists() else 0
        if got != want:
            return f"{name}: {got} rows, the manifest counts {want}"
    if nodes is not None and entry.get("nodes") is not None and nodes.get(tenant, 0) != entry["nodes"]:
        return f"nodes: {nodes.get(tenant, 0)} rows in Lance, the manifest counts {entry['nodes']}"
    if entry.get("nodes") and reader.graph_bytes(tenant) is None:
        return "graph missing"
    return None


def _kept(reader: StoreReader, report: Report) -> None:
    key = reader.manifest.get("session_build_key")
    if not key or not (reader.path / SESSIONS_SUBDIR / key).is_dir():
        return
    kept = SessionStore(reader.path, key)
    bad = kept.verify()
    report.checked["kept session blocks"] += len(set(kept.index().column("block").to_pylist())) + len(kept.unreadable)
    listed = set(kept.index().column("session_key").to_pylist())
    for tenant in reader.tenants():  # a reference to sessions gone: the tenant's queries encode it anew
        refs = [r for r in tenant_references(reader, tenant) if r.get("session_build_key") == key]
        gone = [k for r in refs[:1] for k in r["sessions"] if k not in listed]
        if gone:
            report.problems.append(f"tenant {tenant}: {len(gone)} kept session(s) its token matrix refers to are gone "
                                   f"(its auto queries encode it again: seconds, and another ranking); "
                                   f"{_rebuild(reader.path, tenant, [])}")
    for tenant, why in sorted(damaged_tenants(reader).items()):
        report.problems.append(f"tenant {tenant}: {why}; drop it (memlib verify --store {reader.path} --drop-damaged)"
                               f", then {_rebuild(reader.path, tenant, [])}")
    for block, why in sorted(bad.items()):
        report.damaged.append(kept.root / "blocks" / block)
        report.problems.append(f"kept session block {block}: {why}; drop it: memlib verify --store {reader.path} "
                               f"--drop-damaged (a build computes its sessions again)")


def _late(reader: StoreReader, report: Report) -> None:
    for f in sorted((reader.path / LATE_CACHE_SUBDIR).glob("late-*.npz")):
        report.checked["token matrix files"] += 1
        try:
            with zipfile.ZipFile(f) as z:
                if z.testzip() is not None:  # each member's CRC-32, written by the zip format
                    raise zipfile.BadZipFile("a member's checksum does not match")
            with np.load(f, allow_pickle=False) as z:
                z["turn_ids"], z["owner"]  # noqa: B018 - decodes
        except Exception as exc:  # noqa: BLE001 - any decoding failure names the file
            report.damaged.append(f)
            report.problems.append(f"token matrix {f.name}: {' '.join(str(exc).split())[:120]}; drop it: memlib "
                                   f"verify --store {reader.path} --drop-damaged (the next query encodes it again)")


def _llm(reader: StoreReader, report: Report) -> None:
    from memlib.llm.cache import ResponseCache

    for f in sorted((reader.path / "cache" / "llm").glob("*/*.json")):
        report.checked["LLM responses"] += 1
        if ResponseCache(f.parent.parent).get(f.stem) is None:
            report.damaged.append(f)
            report.problems.append(f"LLM response {f.name}: unreadable or not the one written; drop it: memlib verify "
                                   f"--store {reader.path} --drop-damaged (the next build asks again)")


def verify(store: Path) -> Report:
    """The problems of the published version of ``store`` (a :class:`StoreError` when it has none)."""
    reader = StoreReader(store)
    report = Report()
    earlier = sorted(p.stem for p in (Path(store) / "manifests").glob("v*.json") if p.stem != reader.version)
    _tenants(reader, report, earlier)
    _lance_files(reader, report, earlier)
    _kept(reader, report)
    _late(reader, report)
    _llm(reader, report)
    return report


def drop(report: Report) -> list[str]:
    """Remove the damaged kept files of ``report`` (blocks with their index files); what was removed."""
    import shutil

    out = []
    for path in report.damaged:
        if path.is_dir():
            (path.parent.parent / "index" / f"{path.name}.parquet").unlink(missing_ok=True)
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        out.append(str(path))
    return out


def as_json(report: Report) -> str:
    return json.dumps({"problems": report.problems, "checked": dict(report.checked)}, indent=2)
