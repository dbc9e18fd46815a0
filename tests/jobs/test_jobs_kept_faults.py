"""Fault injection into the kept session blocks: each of a block's files
truncated, its bytes flipped mid-file, deleted, or its index file garbled. The service never
answers from such a block (nor from a matrix encoded anew, another ranking): its tenants are
503 ``tenant_unavailable`` and ``/healthz`` is degraded, the others answer as before. A nightly
run drops the damaged blocks and computes their sessions again: it publishes what it publishes
over an intact cache, and the next run finds nothing damaged. The session's fault store
(tests/jobs/conftest.py) is copied per case; the service is the in-process one."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from memlib.io import checksums
from memlib.io.store import StoreReader, read_manifest
from memlib.io.views import VIEW_TURNS, view_path
from memlib.retrieve.matrix_cache import damaged_tenants, tenant_references
from tests.jobs.faults import (
    QUERIES,
    answers,
    damage,
    damage_lance,
    fresh,
    kept,
    nightly,
    nightly_input,
    turn_vectors,
    vector_bytes,
    verify,
)

pytestmark = pytest.mark.ray  # `memlib build` starts Ray


@pytest.fixture(scope="module")
def intact(fault_store) -> Path:
    return fault_store  # built once for the session, shared with tests/jobs/test_jobs_lance_faults.py


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
    for (tenant, _), ranks in got.items():
        if tenant in hit:
            assert ranks == ["tenant_unavailable"] * len(QUERIES), (tenant, ranks)
        else:
            assert ranks == before[tenant, "auto"]
    assert health.status == "degraded" and set(hit) <= set(health.broken), health


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


def test_a_nightly_drops_damaged_kept_blocks_and_lance_rows_and_publishes_what_an_intact_store_gives(intact,
                                                                                                    tmp_path):
    """One nightly run over a store damaged everywhere a nightly reads: every kept block, maya's
    published Lance rows (a fact's vector, which a nightly copies from them when its text and
    provenance are unchanged: memlib/compose/reuse.py), the turn-text table's full-text index, and
    raj's published turns file (raj is unchanged in the input: a tenant to carry)."""
    store = tmp_path / "store"
    shutil.copytree(intact, store)
    fresh()
    ks = kept(store)
    blocks = sorted(set(ks.index().column("block").to_pylist()))
    for i, block in enumerate(blocks):  # every block: whichever sessions the run reuses are damaged
        damage(ks.root / "blocks" / block / ("turn_vectors.arrow", "nodes.arrow", "token_int8t.arrow")[i % 3],
               ("flip", "truncate")[i % 2])
    node, vec = vector_bytes(store, "fact", "maya")
    damage_lance(store, "fact", "flip")
    damage_lance(store, "turn_text_fts", "flip")
    turns = StoreReader(store).table_file("turns", "raj")  # truncated (item 6)
    damage(turns, "truncate")
    proc = nightly(store, nightly_input(tmp_path, unchanged="raj"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "kept session block" in proc.stdout and "is damaged" in proc.stdout, proc.stdout
    assert "the published lance turn_text table's index files are damaged" in proc.stdout, proc.stdout
    m = read_manifest(store)
    assert "raj" in m["incremental"]["built"]  # rebuilt from the input, not carried
    assert "DamagedFileError" in m["tenant_reused"]["maya"].get("error", ""), m["tenant_reused"]["maya"]
    after = StoreReader(store).nodes("maya", columns=["node_id", "embedding"])
    got = dict(zip(after.column("node_id").to_pylist(), after.column("embedding").to_pylist()))
    assert np.asarray(got[node], np.float32).tobytes() == vec  # computed again, not the damaged copy
    # a damaged block of sessions no tenant asks for any more is left for --compact; verify names it
    assert all(line.startswith("kept session block ") for line in verify(store).output.splitlines()[:-1])
    assert verify(store, "--drop-damaged").exit_code == 3 and verify(store).exit_code == 0
    fresh()
    # what the published tenants refer to was kept again, undamaged: the next run finds nothing to drop
    assert damaged_tenants(StoreReader(store)) == {}
    reused = set(kept(store).index().column("block").to_pylist()) & set(blocks)
    assert set(kept(store).verify()) <= reused  # a damaged block left is one of sessions no longer asked for
    old, new = turn_vectors(intact), turn_vectors(store)
    assert set(old) < set(new)
    for node, vec in old.items():  # the sessions computed again give the vectors they gave
        np.testing.assert_array_equal(new[node], vec)
    got, health = answers(store, ("auto", "dense", "bm25"))
    assert health.status == "ok" and all(isinstance(r, list) for rs in got.values() for r in rs), got
    assert all(r for (_, strategy), rs in got.items() for r in rs if strategy == "auto"), got


def test_verify_says_whole_of_an_intact_store(intact):
    res = verify(intact)
    assert res.exit_code == 0, res.output
    assert res.output.strip().splitlines()[-1].startswith(f"{intact}: whole (4 tenants, 2 lance tables, ")


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
