"""Fault injection into the store's Lance tables (issue 39): a data file with bytes flipped in one
row's vector, truncated or deleted, a full-text index file or a Lance version manifest flipped.
Lance reads a flipped data file without an error (the row comes back with other values), so each
tenant's rows carry a content checksum (memlib/io/lance_checks.py). The service never answers from
damaged rows: the strategies that read them answer 503 ``tenant_unavailable`` for the tenants
hit, ``/healthz`` names those, and what is whole (the other strategies and tenants) answers as before.
A nightly never reuses a damaged row (tests/jobs/test_jobs_kept_faults.py, the nightly over a store
damaged everywhere); ``memlib verify`` names the damage and its repair. The store is the session's
fault store (tests/jobs/conftest.py), copied per case."""
from __future__ import annotations

import shutil
import time

import pytest

from memlib.io.store import StoreReader, read_manifest
from tests.jobs.faults import QUERIES, answers, damage, damage_lance, fresh, raw_rows, verify

pytestmark = pytest.mark.ray  # the store is built by `memlib build`, which starts Ray
STRATEGIES = ("auto", "dense", "bm25")
# the strategies that read each Lance table's rows: ``auto`` reads its facts' and events' vectors
# from the tenant's memory view (checksummed, written by the build: docs/decisions/0036-memory-view.md),
# and from Lance only in a store without one
READS = {"nodes": ("dense",), "turn_text": ("bm25",)}
READS_WITHOUT_MEMORY_VIEW = {"nodes": ("dense", "auto"), "turn_text": ("bm25",)}


@pytest.fixture(scope="module")
def intact_answers(fault_store):
    fresh()
    return answers(fault_store, STRATEGIES)


CASES = [("fact", "flip"), ("turn", "flip"), ("nodes", "truncate"), ("nodes", "delete"), ("turn_text", "flip"),
         ("turn_text_fts", "flip"), ("nodes_fts", "flip"), ("nodes_manifest", "flip")]


@pytest.mark.parametrize(("what", "how", "memory_view"), [*((w, h, True) for w, h in CASES), ("fact", "flip", False)],
                         ids=[*(f"{w}-{h}" for w, h in CASES), "fact-flip-without-memory-view"])
def test_the_service_never_answers_from_damaged_lance_rows(fault_store, intact_answers, tmp_path, what, how,
                                                           memory_view):
    store = tmp_path / "store"
    shutil.copytree(fault_store, store)
    if not memory_view:  # a store written before memory views: auto reads its memories' vectors from Lance
        _without_memory_views(store)
    fresh()
    reads = READS if memory_view else READS_WITHOUT_MEMORY_VIEW
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
    got, health = answers(store, STRATEGIES)
    for (tenant, strategy), ranks in got.items():
        if tenant in hit and strategy in reads[table]:
            assert ranks == ["tenant_unavailable"] * len(QUERIES), (tenant, strategy, ranks)
        else:  # what is whole answers as before
            assert ranks == before[tenant, strategy], (tenant, strategy)
    assert health.status == "degraded" and hit <= set(health.broken), health
    assert all("lance" in health.broken[t] for t in hit), health.broken


def _without_memory_views(store) -> None:
    import json

    from memlib.io.memory_view import VIEW_MEMORY
    from memlib.io.reader_checks import FILES_KEY
    from memlib.io.store import MANIFEST

    shutil.rmtree(StoreReader(store).version_dir / VIEW_MEMORY)
    m = json.loads((store / MANIFEST).read_text())
    m[FILES_KEY] = {k: v for k, v in m[FILES_KEY].items() if not k.startswith(VIEW_MEMORY + "/")}
    (store / MANIFEST).write_text(json.dumps(m))


def test_a_damaged_memory_view_is_read_around(fault_store, intact_answers, tmp_path):
    """Bytes flipped in a part's memory view: no strategy answers from it, and none is refused
    (``auto`` reads the memories' vectors from intact Lance rows and the graph file, the same floats);
    ``memlib verify`` names the file."""
    from memlib.io.memory_view import VIEW_MEMORY
    from memlib.io.views import view_path

    store = tmp_path / "store"
    shutil.copytree(fault_store, store)
    fresh()
    r = StoreReader(store)
    damage(view_path(r.version_dir, VIEW_MEMORY, r.part_of("maya")), "flip")
    got, health = answers(store, STRATEGIES)
    assert got == intact_answers[0] and health.status == "ok", health
    res = verify(store)
    assert res.exit_code == 3 and VIEW_MEMORY in res.output, res.output


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
    from typer.testing import CliRunner

    from jobs.cli import app

    shown = CliRunner().invoke(app, ["inspect", "--store", str(store)]).output
    assert "BROKEN tenant maya: lance nodes rows of tenant 'maya' are not the ones written" in shown, shown


def test_a_carried_file_with_bytes_flipped_is_rebuilt_and_an_intact_one_costs_a_stat(fault_store, tmp_path):
    """A nightly's check of the tenants it carries (jobs/builder/guards.py ``rebuild_damaged``): a file
    written since its checksum was computed is hashed, so bytes flipped in place (the size unchanged)
    make its tenants rebuilt from the input, not carried; an untouched file is not hashed."""
    from jobs.builder.guards import rebuild_damaged
    from jobs.builder.plan import Plan
    from memlib.io import checksums

    store = tmp_path / "store"
    shutil.copytree(fault_store, store)
    fresh()
    plan = Plan(carry=["elena", "raj"])
    rebuild_damaged(plan, StoreReader(store))
    assert plan.carry == ["elena", "raj"] and plan.build == [] and not checksums._VERIFIED  # a stat each
    damage(StoreReader(store).table_file("edges", "raj"), "flip")
    plan = Plan(carry=["elena", "raj"])
    rebuild_damaged(plan, StoreReader(store))
    assert "raj" in plan.build and "raj" not in plan.carry, plan  # elena too: one part holds both


def test_a_carried_tenant_whose_lance_rows_are_damaged_is_rebuilt(fault_store, tmp_path):
    """Bytes flipped in a Lance data file: the nightly hashes the data files written since their
    checksum was computed, finds it, and reads the rows of the tenants it would carry: maya's are not
    the ones written, so maya is rebuilt from the input; raj's are, so raj is carried."""
    from jobs.builder.guards import rebuild_damaged
    from jobs.builder.plan import Plan

    store = tmp_path / "store"
    shutil.copytree(fault_store, store)
    fresh()
    damage_lance(store, "fact", "flip")
    plan = Plan(carry=["maya", "raj"])
    rebuild_damaged(plan, StoreReader(store))
    assert plan.build == ["maya"] and plan.carry == ["raj"], plan


def test_the_background_check_goes_tenant_by_tenant_at_a_tenth_of_a_core(fault_store, tmp_path, monkeypatch):
    """The service's start hashes no version whole: its thread checks one tenant at a time and after
    each sleeps 9 times what the tenant took (memlib/serve/file_checks.py); it still reports a
    damaged tenant nobody asked for (maya's Lance rows) before any query."""
    from memlib.io.checksums import LANCE
    from memlib.serve import file_checks
    from memlib.serve.service import SearchService
    from tests.serve.conftest import ADMIN, bearer, sample_serve_config

    calls: list[tuple[str, bool, float, float]] = []
    real = file_checks.tenant_damage

    def timed(reader, tenant, loaded=False):
        t0 = time.perf_counter()
        found = real(reader, tenant, loaded)
        calls.append((tenant, loaded, t0, time.perf_counter()))
        return found

    monkeypatch.setattr(file_checks, "tenant_damage", timed)
    store = tmp_path / "store"
    shutil.copytree(fault_store, store)
    fresh()
    damage_lance(store, "fact", "flip")
    svc = SearchService(store, sample_serve_config(preload_tenants=0)).start()
    try:
        assert len(calls) <= 1  # started, not run: nothing hashed by start() itself
        deadline = time.time() + 60
        while time.time() < deadline and svc.checked_version != svc.cache.version:
            time.sleep(0.02)
        assert svc.checked_version == svc.cache.version
        assert [c[0] for c in calls] == sorted(read_manifest(store)["tenants"]) and not any(c[1] for c in calls)
        for (_, _, s0, e0), (_, _, s1, _) in zip(calls, calls[1:]):
            assert s1 - e0 >= 0.9 * file_checks.CHECK_DUTY ** -1 * (e0 - s0) - (e0 - s0), calls  # a tenth of a core
        health = svc.health(bearer(ADMIN)["Authorization"])
        assert list(health.broken) == ["maya"] and "lance" in health.broken["maya"], health
        assert svc.broken["maya"].startswith(file_checks.PARTIAL[LANCE])  # auto still answers for maya
    finally:
        svc.stop()
