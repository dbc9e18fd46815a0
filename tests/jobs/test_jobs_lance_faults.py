"""Fault injection into the store's Lance tables (issue 39): a data file with bytes flipped in one
row's vector, truncated or deleted, a full-text index file or a Lance version manifest flipped.
Lance reads a flipped data file without an error (the row comes back with other values), so each
tenant's rows carry a content checksum (memlib/io/lance_checks.py). The service never answers from
damaged rows: the strategies that read them answer 503 ``tenant_unavailable`` for the tenants
hit, ``/healthz`` names those, and what is whole (``auto``, the other tenants) answers as before.
A nightly never reuses a damaged row; ``memlib verify`` names the damage and its repair. The
store is the session's fault store (tests/jobs/conftest.py), copied per case."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from memlib.io import checksums, reader_checks
from memlib.io.store import StoreReader, connect, read_manifest
from memlib.serve.errors import ApiError
from tests.jobs.test_jobs_kept_faults import QUERIES, damage, nightly, nightly_input, verify
from tests.serve.conftest import ADMIN, bearer, sample_serve_config

pytestmark = pytest.mark.ray  # the store is built by `memlib build`, which starts Ray
STRATEGIES = ("auto", "dense", "bm25")
READS = {"nodes": "dense", "turn_text": "bm25"}  # the strategy that reads each Lance table's rows


def fresh() -> None:
    """As in a new process: nothing checked yet."""
    checksums.forget()
    reader_checks.forget_rows()


def answers(store: Path) -> tuple[dict, object]:
    """((tenant, strategy) -> the ranking of each query, or the error code) and the service's health."""
    from memlib.serve.service import SearchService

    svc = SearchService(store, sample_serve_config()).start()
    try:
        out = {}
        for tenant in svc.cache.tenants():
            for strategy in STRATEGIES:
                got = []
                for q in QUERIES:
                    body = json.dumps({"tenant": tenant, "query": q, "strategy": strategy, "k": 5}).encode()
                    try:
                        res = svc.search(svc.parse(bearer(ADMIN)["Authorization"], body)[1])
                        got.append([t.node_id for t in res.turns])
                    except ApiError as exc:
                        got.append(exc.code.value)
                out[tenant, strategy] = got
        deadline = time.time() + 20  # the background check goes through the tenants not asked for
        while time.time() < deadline and svc.checked_version != svc.cache.version:
            time.sleep(0.1)
        return out, svc.health(bearer(ADMIN)["Authorization"])
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def intact_answers(fault_store):
    fresh()
    return answers(fault_store)


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


CASES = [("fact", "flip"), ("turn", "flip"), ("nodes", "truncate"), ("nodes", "delete"), ("turn_text", "flip"),
         ("turn_text_fts", "flip"), ("nodes_fts", "flip"), ("nodes_manifest", "flip")]


@pytest.mark.parametrize(("what", "how"), CASES, ids=[f"{w}-{h}" for w, h in CASES])
def test_the_service_never_answers_from_damaged_lance_rows(fault_store, intact_answers, tmp_path, what, how):
    store = tmp_path / "store"
    shutil.copytree(fault_store, store)
    fresh()
    table = "turn_text" if what.startswith("turn_text") else "nodes"
    damage_lance(store, what, how)
    before, health_before = intact_answers
    assert health_before.status == "ok" and all(isinstance(r, list) for rs in before.values() for r in rs)
    if what.endswith(("fts", "manifest")):  # a file of the table every tenant's search reads
        hit = set(read_manifest(store)["tenants"])
    else:  # the tenants whose rows Lance returns changed, or not at all
        intact_rows, rows = raw_rows(fault_store, table), raw_rows(store, table)
        hit = {t for t in rows if rows[t] != intact_rows[t]}
        assert hit, "the damage changed no tenant's rows"
    got, health = answers(store)
    for (tenant, strategy), ranks in got.items():
        if tenant in hit and strategy == READS[table]:
            assert ranks == ["tenant_unavailable"] * len(QUERIES), (tenant, strategy, ranks)
        elif strategy in ("auto", READS[table]) or not what.endswith("manifest"):  # what is whole answers
            assert ranks == before[tenant, strategy], (tenant, strategy)
    assert health.status == "degraded" and hit <= set(health.broken), health
    assert all("lance" in health.broken[t] for t in hit), health.broken


def test_verify_names_damaged_lance_rows_and_files(fault_store, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(fault_store, store)
    fresh()
    damage_lance(store, "fact", "flip")
    damage_lance(store, "turn_text_fts", "flip")
    res = verify(store)
    assert res.exit_code == 3, res.output
    lines = res.output.strip().splitlines()
    assert any(line.startswith("tenant maya: lance nodes rows of tenant 'maya' are not the ones written")
               and "rebuild it: memlib build --incremental" in line for line in lines), lines
    assert any(line.startswith("lance turn_text table: ") and "index it again" in line for line in lines), lines
    assert not any(line.startswith(("tenant raj", "tenant elena", "tenant tomas-lena")) for line in lines), lines


def test_a_nightly_never_reuses_a_damaged_lance_row_nor_carries_a_damaged_file(fault_store, tmp_path):
    """A fact's vector is copied from the tenant's published Lance rows when its text and
    provenance are unchanged (memlib/compose/reuse.py): with bytes of it flipped, a nightly must
    compute it again, and index the damaged full-text index anew. And raj, unchanged in the
    input (a tenant to carry), has 16 bytes of its published turns file flipped, its size
    unchanged: the nightly must not carry it as whole (it checks the bytes of a carried file
    written since its checksum was computed)."""
    store = tmp_path / "store"
    shutil.copytree(fault_store, store)
    fresh()
    node, vec = vector_bytes(store, "fact", "maya")
    damage_lance(store, "fact", "flip")
    damage_lance(store, "turn_text_fts", "flip")
    damage(StoreReader(store).table_file("turns", "raj"), "flip")
    proc = nightly(store, nightly_input(tmp_path, unchanged="raj"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the published lance turn_text table's index files are damaged" in proc.stdout, proc.stdout
    m = read_manifest(store)
    assert "maya" in m["incremental"]["built"]
    assert "raj" in m["incremental"]["built"]  # rebuilt from the input, not carried
    assert "DamagedFileError" in m["tenant_reused"]["maya"].get("error", ""), m["tenant_reused"]["maya"]
    after = StoreReader(store).nodes("maya", columns=["node_id", "embedding"])
    got = dict(zip(after.column("node_id").to_pylist(), after.column("embedding").to_pylist()))
    assert np.asarray(got[node], np.float32).tobytes() == vec  # computed again, not the damaged copy
    fresh()
    res = verify(store)
    assert res.exit_code == 0, res.output
