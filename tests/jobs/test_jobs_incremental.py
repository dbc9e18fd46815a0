"""Incremental nightly rebuilds on one store: carry-over, forgetting, a corrupt input file,
a reader during publish, rollback and compaction (hard deletion)."""
from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from tests.jobs.conftest import node_rows, published_text, run_cli, tenant_lines, write_jsonl

pytestmark = pytest.mark.ray
FORGOTTEN = ("lasagne", "Zanzibar", "Nilla", "chess final")


def _build(inp: Path, store: Path, *extra: str):
    return run_cli(["build", "--incremental", "--input", str(inp), "--format", "jsonl", "--out", str(store),
                    "--num-cpus", "2", *extra])


def _reader_loop(store: Path, stop: threading.Event, seen: list, errors: list) -> None:
    from memlib.io.store import StoreReader

    while not stop.is_set():
        try:
            r = StoreReader(store)
            seen.append((r.version, r.nodes(columns=["node_id"]).num_rows))
        except Exception as exc:  # noqa: BLE001 - the test records any reader failure
            errors.append(repr(exc))


@pytest.fixture(scope="module")
def history(base_store, tmp_path_factory):
    """v1 (copied base) -> v2 (emil changed, gus gone (input declared complete), dora/dora-b forgotten; a reader polls
    meanwhile) -> v3 (same data as per-tenant files) -> v4 (fay's file corrupt, emil changed)."""
    d = tmp_path_factory.mktemp("jobs_history")
    store = d / "store"
    shutil.copytree(base_store[1], store)
    out = {"store": store, "results": {}, "text": {"v1": published_text(store)}}
    inp = write_jsonl(d / "in.jsonl", ["dora", "emil", "fay"], {"emil": " It was sunny."})
    (d / "forget.txt").write_text("dora/dora-b\n", encoding="utf-8")
    stop, seen, errors = threading.Event(), [], []
    reader = threading.Thread(target=_reader_loop, args=(store, stop, seen, errors), daemon=True)
    reader.start()
    out["results"]["v2"] = _build(inp, store, "--delete", str(d / "forget.txt"), "--input-is-complete",
                                  "--max-removed-share", "0.25")
    stop.set()
    reader.join(30)
    out.update(seen=seen, errors=errors, text_v2=published_text(store))
    files = d / "files"
    files.mkdir()
    for t in ("dora", "emil", "fay"):
        write_jsonl(files / f"{t}.jsonl", [t], {"emil": " It was sunny."})
    out["results"]["v3"] = _build(files, store)
    out["results"]["again"] = _build(files, store)  # the same files again: nothing to publish
    out["after_again"] = (json.loads((store / "manifest.json").read_text())["version"],
                          sorted(p.name for p in (store / "versions").iterdir()))
    write_jsonl(files / "emil.jsonl", ["emil"], {"emil": " It rained later."})
    (files / "fay.jsonl").write_bytes(b"\x00\x01 not json at all \xff\n" * 5)
    out["results"]["v4"] = _build(files, store)
    out["manifests"] = {v: json.loads((store / "manifests" / f"{v}.json").read_text()) for v in
                        ("v000001", "v000002", "v000003", "v000004")}
    return out


def test_jobs_incremental_v2_rebuilds_only_changed(history):
    res = history["results"]["v2"]
    assert res.exit_code == 0, res.output + repr(res.exception)
    inc = history["manifests"]["v000002"]["incremental"]
    assert inc["built"] == ["dora", "emil"] and inc["carried"] == ["fay"] and inc["deleted"] == ["gus"]
    # no embedding / extraction work for carried tenants: stage timings exist only for rebuilt ones
    assert sorted(history["manifests"]["v000002"]["tenant_timings_s"]) == ["dora", "emil"]
    store = history["store"]
    from memlib.io.store import StoreReader

    r1, r2 = (StoreReader(store, history["manifests"][v]) for v in ("v000001", "v000002"))
    for table in ("turns", "edges", "segments"):  # carried as published: copied rows, not rebuilt ones
        assert r1.table(table, "fay").equals(r2.table(table, "fay")) and r2.table(table, "fay").num_rows
    assert r1.graph_bytes("fay") == r2.graph_bytes("fay")
    # its part also held rebuilt and deleted tenants: carried into a part of its own, holding only it
    assert r2.part_of("fay") != r1.part_of("fay") and r2.parts()[r2.part_of("fay")] == ["fay"]
    assert set(r2.table("turns", None, ["tenant_id"]).column("tenant_id").to_pylist()) == {"dora", "emil", "fay"}
    m1 = history["manifests"]["v000001"]
    fay_nodes = [r for r in node_rows(store, history["manifests"]["v000002"]) if r[1] == "fay"]
    assert fay_nodes == [r for r in node_rows(store, m1) if r[1] == "fay"] and fay_nodes


def test_jobs_incremental_forgetting_is_exact(history):
    before, after = history["text"]["v1"], history["text_v2"]
    for needle in FORGOTTEN:
        assert needle in before, needle  # the check can fail: the text was there
        assert needle not in after, needle
    assert "bandoneon" in after and "Marigold" in after and "linden honey" in after
    assert history["manifests"]["v000002"]["forgotten"]["conversations"] == ["dora/dora-b"]


def test_jobs_incremental_reader_never_sees_mixed_state(history):
    assert not history["errors"], history["errors"][:3]
    counts = {m["version"]: m["row_counts"]["nodes"] for m in history["manifests"].values()}
    assert history["seen"], "the reader ran"
    for version, n in history["seen"]:
        assert counts[version] == n, (version, n)
    assert {v for v, _ in history["seen"]} <= {"v000001", "v000002"}


def test_jobs_incremental_same_data_carries_everything(history):
    res = history["results"]["v3"]
    assert res.exit_code == 0, res.output + repr(res.exception)
    inc = history["manifests"]["v000003"]["incremental"]
    assert inc["built"] == [] and inc["carried"] == ["dora", "emil", "fay"]
    assert history["manifests"]["v000003"]["row_counts"] == history["manifests"]["v000002"]["row_counts"]
    # nothing to build: the run never asks for Ray (a run that builds does, while it shards)
    assert "ray_start" not in history["manifests"]["v000003"]["stage_timings_s"]
    assert "ray_start" in history["manifests"]["v000002"]["stage_timings_s"]


def test_jobs_incremental_unchanged_input_publishes_no_version(history):
    """A run whose input is the published one (same files, hashes, forget list) exits 0 and
    publishes nothing: the published version stays, and no version directory is left behind."""
    res = history["results"]["again"]
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "unchanged" in res.output and "no new version" in res.output
    version, dirs = history["after_again"]
    assert version == "v000003" and dirs[-1] == "v000003"
    assert history["manifests"]["v000004"]["base_version"] == "v000003"  # the next run builds on v3


def test_jobs_incremental_counts_sum_tenants_and_equal_the_rows(history):
    """A run adds up its tenants' counts (rebuilt, carried, failed but kept) instead of reading
    every part back: every version's counts equal what its rows say (before the rollback test
    compacts the store's old versions away)."""
    import polars as pl

    from memlib.io.store import StoreReader

    def count(table) -> dict[str, int]:
        df = pl.from_arrow(table)
        return dict(sorted(zip(*df.group_by("kind").len().to_dict(as_series=False).values()))) if len(df) else {}

    for v, m in history["manifests"].items():
        r = StoreReader(history["store"], m)
        assert m["nodes_by_kind"] == count(r.nodes(columns=["kind"])), v
        assert m["edges_by_kind"] == count(r.table("edges", None, ["kind"])), v
        assert m["row_counts"]["questions"] == r.table("questions", None, ["tenant_id"]).num_rows, v
        counts = r.tenant_counts()
        assert sorted(counts) == sorted(m["tenants"]), v
        assert {k: sum((c["nodes_by_kind"].get(k, 0) for c in counts.values())) for k in m["nodes_by_kind"]} \
            == m["nodes_by_kind"], v
    assert history["manifests"]["v000002"]["nodes_by_kind"] != history["manifests"]["v000001"]["nodes_by_kind"]



def test_jobs_incremental_counts_of_an_older_store_come_from_its_rows(history):
    """A store written before per-tenant counts: its tenants are counted from their rows once
    (the next run's manifest keeps the counts)."""
    from jobs.builder.counts import store_counts
    from memlib.io.store import StoreReader

    m = history["manifests"]["v000002"]
    reader = StoreReader(history["store"], m)
    bare = [{"tenant_id": t, "turns": e["turns"]} for t, e in m["tenants"].items()]
    kinds, questions = store_counts(reader, bare)
    assert kinds == (m["nodes_by_kind"], m["edges_by_kind"]) and questions == m["row_counts"]["questions"]
    kept = reader.tenant_counts()
    for s in bare:
        assert {k: s[k] for k in ("nodes_by_kind", "edges_by_kind", "questions")} == kept[s["tenant_id"]]

def test_jobs_incremental_corrupt_file_fails_one_tenant(history):
    res = history["results"]["v4"]
    assert res.exit_code == 3, res.output
    m = history["manifests"]["v000004"]
    assert m["incremental"]["built"] == ["emil"] and m["incremental"]["carried"] == ["dora"]
    assert list(m["incremental"]["failed"]) == ["fay"] and m["tenants"]["fay"]["status"] == "failed"
    rows = node_rows(history["store"], m)
    before = node_rows(history["store"], history["manifests"]["v000003"])
    assert [r for r in rows if r[1] == "fay"] == [r for r in before if r[1] == "fay"]
    assert any("It rained later" in r[3] for r in rows if r[1] == "emil")


def test_jobs_incremental_rollback_then_compact(history):
    store = history["store"]
    res = run_cli(["build", "--out", str(store), "--rollback", "v000001"])
    assert res.exit_code == 0, res.output
    from memlib.io.store import StoreReader

    assert "gus" in {r[1] for r in node_rows(store)} and StoreReader(store).version == "v000001"
    assert run_cli(["build", "--out", str(store), "--rollback", "v000004"]).exit_code == 0
    assert _store_bytes_contain(store, b"Zanzibar")  # old versions still hold the forgotten rows
    res = run_cli(["build", "--out", str(store), "--compact"])
    assert res.exit_code == 0, res.output
    assert not _store_bytes_contain(store, b"Zanzibar") and not _store_bytes_contain(store, b"zanzibar")
    # kept session outputs are compressed: decode them and look again
    import pyarrow.parquet as pq

    kept = list((store / "cache" / "sessions").rglob("*.parquet"))
    assert kept and not any("zanzibar" in str(pq.read_table(p).to_pylist()).lower() for p in kept)
    # auto's matrix references of the published tenants stay (they name only kept sessions)
    from memlib.io.store import StoreReader
    refs = StoreReader(store).table("matrix_refs", columns=["tenant_id"]).column("tenant_id").to_pylist()
    assert sorted(refs) == sorted(StoreReader(store).tenants())
    assert sorted(p.name for p in (store / "versions").iterdir()) == ["v000004"]
    assert node_rows(store) == node_rows(store, history["manifests"]["v000004"] | {"lance_version": None})
    assert "bandoneon" in published_text(store)


def _store_bytes_contain(store: Path, needle: bytes) -> bool:
    return any(needle in p.read_bytes() for p in store.rglob("*") if p.is_file())


def test_jobs_forget_list_parse_and_filter():
    import pyarrow as pa

    from jobs.builder.plan import ForgetList

    f = ForgetList.parse("gus\n# comment\ndora/dora-b  \n\n")
    assert f.tenants == {"gus"} and f.conversations == {("dora", "dora-b")}
    t = pa.table({"tenant_id": ["gus", "dora", "dora", None], "conversation_id": ["x", "dora-a", "dora-b", None]})
    assert f.keep_rows(t).column("conversation_id").to_pylist() == ["dora-a", None]
    assert len(tenant_lines("dora")) == 16

