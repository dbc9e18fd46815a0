"""What the fault-injection suites share (tests/jobs/test_jobs_kept_faults.py,
tests/jobs/test_jobs_lance_faults.py): ways to damage a file of a store, the in-process service's
answers, a nightly run, ``memlib verify``."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from memlib.compose.session_store import SessionStore
from memlib.io import checksums, reader_checks
from memlib.io.store import StoreReader, connect, read_manifest
from memlib.serve.errors import ApiError
from tests.jobs.conftest import FAULT_BUILD
from tests.serve.conftest import ADMIN, SAMPLE, bearer, sample_serve_config

QUERIES = ("what does she cook at night?", "weekend plans with friends")


def kept(store: Path) -> SessionStore:
    return SessionStore(store, read_manifest(store)["session_build_key"])


def damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "flip":  # a few bytes in the middle, the size unchanged
        mid = len(data) // 2
        data[mid:mid + 16] = bytes(b ^ 0xFF for b in data[mid:mid + 16])
        path.write_bytes(bytes(data))
    elif how == "delete":
        path.unlink()
    elif how == "garble":
        path.write_bytes(b"not parquet" * 10)


def fresh() -> None:
    """As in a new process: nothing checked yet."""
    checksums.forget()
    reader_checks.forget_rows()


def answers(store: Path, strategies: tuple[str, ...] = ("auto",)) -> tuple[dict, object]:
    """((tenant, strategy) -> the ranking of each query, or the error code) and the service's health
    once its background check went through the version (memlib/serve/file_checks.py)."""
    from memlib.serve.service import SearchService

    svc = SearchService(store, sample_serve_config()).start()
    try:
        out = {}
        for tenant in svc.cache.tenants():
            for strategy in strategies:
                got = []
                for q in QUERIES:
                    body = json.dumps({"tenant": tenant, "query": q, "strategy": strategy, "k": 5}).encode()
                    try:
                        res = svc.search(svc.parse(bearer(ADMIN)["Authorization"], body)[1])
                        got.append([t.node_id for t in res.turns])
                    except ApiError as exc:
                        got.append(exc.code.value)
                out[tenant, strategy] = got
        deadline = time.time() + 30
        while time.time() < deadline and svc.checked_version != svc.cache.version:
            time.sleep(0.05)
        assert svc.checked_version == svc.cache.version, "the background check did not go through the version"
        return out, svc.health(bearer(ADMIN)["Authorization"])
    finally:
        svc.stop()


def nightly_input(tmp_path: Path, unchanged: str = "") -> Path:
    """The sample with one new session per tenant but ``unchanged``: those tenants are built again,
    their earlier sessions read from the kept blocks."""
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    extra, seen = [], set()
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("tenant_id") in seen or rec.get("tenant_id") == unchanged or not rec.get("text"):
            continue
        seen.add(rec["tenant_id"])
        extra.append(json.dumps({**rec, "session_id": "later", "turn_id": "later:1",
                                 "session_time": "2024-06-01T10:00:00+00:00",
                                 "text": "Later I started growing tomatoes on the balcony."}))
    out = tmp_path / "nightly.jsonl"
    out.write_text("\n".join(lines + extra) + "\n", encoding="utf-8")
    return out


def nightly(store: Path, source: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.cli", "build", "-i", str(source), "-f", "jsonl",
                           "-o", str(store), "--incremental", "--num-cpus", "2", *FAULT_BUILD],
                          capture_output=True, text=True, timeout=900)


def turn_vectors(store: Path) -> dict[str, np.ndarray]:
    nodes = StoreReader(store).nodes(columns=["node_id", "kind", "embedding"])
    return {n: np.asarray(v) for n, k, v in zip(nodes.column("node_id").to_pylist(), nodes.column("kind").to_pylist(),
                                                 nodes.column("embedding").to_pylist()) if k == "turn"}


def verify(store: Path, *args: str):
    from typer.testing import CliRunner

    from jobs.cli import app

    return CliRunner().invoke(app, ["verify", "--store", str(store), *args])


def raw_rows(store: Path, table: str) -> dict[str, object]:
    """Tenant -> its rows of Lance table ``table`` at the published version as Lance returns them
    (sorted by node id, as Python values), or the error reading them: what memlib is not asked."""
    m = read_manifest(store)
    tbl = connect(store).open_table(table)
    tbl.checkout(m["lance_version" if table == "nodes" else "lance_turn_text_version"])
    out = {}
    for tenant in m["tenants"]:
        try:
            t = tbl.search().where(f"tenant_id = '{tenant}'").limit(None).to_arrow()
            out[tenant] = t.take(pc.sort_indices(t.column("node_id"))).to_pylist()
        except Exception as exc:  # noqa: BLE001 - a damaged file: Lance raises
            out[tenant] = f"raises {type(exc).__name__}"
    return out


def vector_bytes(store: Path, kind: str, tenant: str) -> tuple[str, bytes]:
    """A node of ``kind`` of ``tenant`` and its vector's bytes as the data file holds them."""
    nodes = StoreReader(store).nodes(tenant, columns=["node_id", "kind", "embedding"])
    for node, k, vec in zip(*(nodes.column(c).to_pylist() for c in ("node_id", "kind", "embedding"))):
        if k == kind:
            return node, np.asarray(vec, np.float32).tobytes()
    raise AssertionError(f"{tenant} has no {kind} node")


def damage_lance(store: Path, what: str, how: str) -> Path:
    """Damage one Lance file of ``store``: ``what`` names it (``nodes``/``turn_text`` data,
    ``fact``/``turn`` the data file at one of maya's vectors, ``fts``/``manifest`` of a table)."""
    table = "turn_text" if what.startswith("turn_text") else "nodes"
    root = store / "lance" / f"{table}.lance"
    if what.endswith("fts"):
        path = sorted(root.glob("_indices/*/part_0_invert.lance"))[-1]
    elif what.endswith("manifest"):
        m = read_manifest(store)
        path = root / "_versions" / f"{2 ** 64 - 1 - m['lance_version']}.manifest"
    else:
        (path,) = sorted(root.glob("data/*.lance"))
    data = bytearray(path.read_bytes())
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:  # bytes flipped in place, the size unchanged: mid-file, or inside one node's vector
        at = len(data) // 2
        if what in ("fact", "turn"):
            at = bytes(data).index(vector_bytes(store, what, "maya")[1]) + 100
        data[at:at + 8] = bytes(b ^ 0xFF for b in data[at:at + 8])
        path.write_bytes(bytes(data))
    return path


