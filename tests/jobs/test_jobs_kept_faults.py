"""Fault injection into the kept session blocks: each of a block's files
truncated, its bytes flipped mid-file, deleted, or its index file garbled. The service never
answers from such a block (nor from a matrix encoded anew, another ranking): its tenants are
503 ``tenant_unavailable`` and ``/healthz`` is degraded, the others answer as before. A nightly
run drops the damaged blocks and computes their sessions again: it publishes what it publishes
over an intact cache, and the next run finds nothing damaged. One sample store is built for the
module and copied per case; the service is the in-process one."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from memlib.compose.session_store import SessionStore
from memlib.io import checksums
from memlib.io.store import StoreReader, read_manifest
from memlib.io.views import VIEW_TURNS, view_path
from memlib.retrieve.matrix_cache import damaged_tenants, tenant_references
from memlib.serve.errors import ApiError
from tests.serve.conftest import ADMIN, SAMPLE, bearer, build_sample, sample_serve_config

pytestmark = pytest.mark.ray  # `memlib build` starts Ray
EMBED = ["--set", "embed.backend=wordllama", "--set", "embed.dim=256",
         "--set", "retrieve.precompute_token_matrices=true", "--set", "ray.block_turns=40"]
QUERIES = ("what does she cook at night?", "weekend plans with friends")


@pytest.fixture(scope="module")
def intact(tmp_path_factory) -> Path:
    return build_sample(tmp_path_factory.mktemp("kept_faults") / "store", *EMBED)


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


def answers(store: Path) -> tuple[dict, object]:
    """(tenant -> the auto ranking of each query, or the error code) and the service's health."""
    from memlib.serve.service import SearchService

    svc = SearchService(store, sample_serve_config()).start()
    try:
        out = {}
        for tenant in svc.cache.tenants():
            got = []
            for q in QUERIES:
                body = json.dumps({"tenant": tenant, "query": q, "strategy": "auto", "k": 5}).encode()
                try:
                    res = svc.search(svc.parse(bearer(ADMIN)["Authorization"], body)[1])
                    got.append([t.node_id for t in res.turns])
                except ApiError as exc:
                    got.append(exc.code.value)
            out[tenant] = got
        deadline = time.time() + 20  # the kept blocks are checked on a thread as the version opens
        while time.time() < deadline and svc.health().status == "ok" and not any(
                isinstance(g, str) for gs in out.values() for g in gs):
            time.sleep(0.1)
        return out, svc.health(bearer(ADMIN)["Authorization"])
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def intact_answers(intact):
    return answers(intact)


CASES = [("turn_vectors.arrow", "truncate"), ("turn_vectors.arrow", "flip"), ("token_int8t.arrow", "flip"),
         ("token_int8t.arrow", "delete"), ("index", "garble"), ("turns", "flip"), ("view_turns", "flip")]


@pytest.mark.parametrize(("name", "how"), CASES, ids=[f"{n}-{h}" for n, h in CASES])
def test_the_service_never_answers_from_a_damaged_kept_block(intact, intact_answers, tmp_path, name, how):
    store = tmp_path / "store"
    shutil.copytree(intact, store)
    checksums.forget()  # a fresh process: nothing checked yet
    ks, reader = kept(store), StoreReader(store)
    idx = ks.index()
    block = idx.column("block")[0].as_py()
    hit = sorted(set(idx.filter(idx.column("block").to_numpy(zero_copy_only=False) == block)
                     .column("tenant_id").to_pylist()))
    if name in ("turns", "view_turns"):  # a published file of elena's part: every tenant of the part
        path = reader.table_file("turns", "elena") if name == "turns" else \
            view_path(reader.version_dir, VIEW_TURNS, reader.part_of("elena"))
        hit = sorted(t for t in reader.tenants() if reader.part_of(t) == reader.part_of("elena"))
    else:
        path = ks.root / "index" / f"{block}.parquet" if name == "index" else ks.root / "blocks" / block / name
    damage(path, how)
    got, health = answers(store)
    before, _ = intact_answers
    assert intact_answers[1].status == "ok" and all(isinstance(r, list) for rs in before.values() for r in rs)
    for tenant, ranks in got.items():
        if tenant in hit:
            assert ranks == ["tenant_unavailable"] * len(QUERIES), (tenant, ranks)
        else:
            assert ranks == before[tenant]
    assert health.status == "degraded" and set(hit) <= set(health.broken), health


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
                           "-o", str(store), "--incremental", "--num-cpus", "2", *EMBED],
                          capture_output=True, text=True, timeout=900)


def turn_vectors(store: Path) -> dict[str, np.ndarray]:
    nodes = StoreReader(store).nodes(columns=["node_id", "kind", "embedding"])
    return {n: np.asarray(v) for n, k, v in zip(nodes.column("node_id").to_pylist(), nodes.column("kind").to_pylist(),
                                                 nodes.column("embedding").to_pylist()) if k == "turn"}


def test_a_deleted_late_cache_changes_no_answer(intact, intact_answers, tmp_path):
    """Item 5: a tenant's token-matrix reference is published (``matrix_refs``, the turns view;
    decision 0028), not kept in ``cache/late``: with that directory deleted after queries wrote to
    it, every tenant answers as before and the service stays healthy."""
    store = tmp_path / "store"
    shutil.copytree(intact, store)
    checksums.forget()
    answers(store)  # queries may write matrices into cache/late
    shutil.rmtree(store / "cache" / "late", ignore_errors=True)
    checksums.forget()
    after, health = answers(store)
    assert after == intact_answers[0] and health.status == "ok"


def test_a_nightly_drops_damaged_kept_blocks_and_publishes_what_an_intact_cache_gives(intact, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(intact, store)
    ks = kept(store)
    blocks = sorted(set(ks.index().column("block").to_pylist()))
    for i, block in enumerate(blocks):  # every block: whichever sessions the run reuses are damaged
        damage(ks.root / "blocks" / block / ("turn_vectors.arrow", "nodes.parquet", "token_int8t.arrow")[i % 3],
               ("flip", "truncate")[i % 2])
    # and raj, unchanged in the input (a tenant to carry), has its published turns file truncated (item 6)
    turns = StoreReader(store).table_file("turns", "raj")
    damage(turns, "truncate")
    proc = nightly(store, nightly_input(tmp_path, unchanged="raj"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "kept session block" in proc.stdout and "is damaged" in proc.stdout, proc.stdout
    assert "raj" in read_manifest(store)["incremental"]["built"]  # rebuilt from the input, not carried
    # a damaged block of sessions no tenant asks for any more is left for --compact; verify names it
    assert all(line.startswith("kept session block ") for line in verify(store).output.splitlines()[:-1])
    assert verify(store, "--drop-damaged").exit_code == 3 and verify(store).exit_code == 0
    checksums.forget()
    # what the published tenants refer to was kept again, undamaged: the next run finds nothing to drop
    assert damaged_tenants(StoreReader(store)) == {}
    reused = set(kept(store).index().column("block").to_pylist()) & set(blocks)
    assert set(kept(store).verify()) <= reused  # a damaged block left is one of sessions no longer asked for
    old, new = turn_vectors(intact), turn_vectors(store)
    assert set(old) < set(new)
    for node, vec in old.items():  # the sessions computed again give the vectors they gave
        np.testing.assert_array_equal(new[node], vec)
    got, health = answers(store)
    assert health.status == "ok" and all(isinstance(r, list) and r for rs in got.values() for r in rs), got


def verify(store: Path, *args: str):
    from typer.testing import CliRunner

    from jobs.cli import app

    return CliRunner().invoke(app, ["verify", "--store", str(store), *args])


def test_verify_says_whole_of_an_intact_store(intact):
    res = verify(intact)
    assert res.exit_code == 0, res.output
    assert res.output.strip().splitlines()[-1].startswith(f"{intact}: whole (4 tenants, ")


VERIFY_CASES = [("turns", "truncate", "rebuild it: memlib build --incremental"),
                ("turns", "flip", "rebuild it: memlib build --incremental"),
                ("graphs", "truncate", "graphs/"), ("graphs", "delete", "files missing"),
                ("kept", "flip", "drop it: memlib verify"), ("manifest", "truncate", "--rollback")]


@pytest.mark.parametrize(("what", "how", "says"), VERIFY_CASES, ids=[f"{w}-{h}" for w, h, _ in VERIFY_CASES])
def test_verify_names_each_damaged_file_with_its_repair(intact, tmp_path, what, how, says):
    store = tmp_path / "store"
    shutil.copytree(intact, store)
    checksums.forget()
    reader = StoreReader(store)
    tenant = "elena"
    path = {"turns": lambda: reader.table_file("turns", tenant), "graphs": lambda: reader.graph_file(tenant),
            "manifest": lambda: store / "manifest.json",
            "kept": lambda: kept(store).root / "blocks" / kept(store).blocks_holding(
                tenant_references(reader, tenant)[0]["sessions"][:1]).popitem()[1] / "turn_vectors.arrow"}[what]()
    damage(path, how)
    res = verify(store)
    assert res.exit_code == 3, res.output
    lines = res.output.strip().splitlines()
    assert any(says in line for line in lines), lines
    if what != "manifest":
        assert any(line.startswith(f"tenant {tenant}: ") for line in lines), lines
    if (what, how) == ("turns", "flip"):  # decodes, yet not the bytes published: inspect says so too
        from typer.testing import CliRunner

        from jobs.cli import app

        shown = CliRunner().invoke(app, ["inspect", "--store", str(store)]).output
        assert f"BROKEN tenant {tenant}: files damaged" in shown, shown
    if what == "kept":  # dropped, the tenant's matrix is named as referring to sessions gone
        assert "dropped " in verify(store, "--drop-damaged").output
        again = verify(store).output
        assert "kept session block " not in again and f"tenant {tenant}: " in again and "are gone" in again
