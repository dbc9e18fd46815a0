"""The nightly driver under bad inputs: an unusable input publishes
nothing (exit 2); a tenant missing from the input is kept unless the input is declared complete,
and then only within nightly.max_removed_share; a tenant split over two files of an input
directory keeps the turns of both."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.jobs.conftest import ALL, node_rows, published_text, run_cli, tenant_lines, write_jsonl

pytestmark = pytest.mark.ray


def _build(inp: Path, store: Path, *extra: str, incremental: bool = True):
    args = ["build", "--input", str(inp), "--format", "jsonl", "--out", str(store), "--num-cpus", "2",
            "--recipe", "turns", *extra]
    return run_cli(args + (["--incremental"] if incremental else []))


def _with_bad_dates(path: Path, lines: list[str], bad: str, which) -> Path:
    """``lines`` written to ``path``, the records ``which`` picks given the session time ``bad``."""
    recs = [json.loads(line) for line in lines]
    path.write_text("".join(json.dumps({**r, "session_time": bad} if which(r) else r) + "\n" for r in recs),
                    encoding="utf-8")
    return path


def _forget_file(tmp_path: Path, *ids: str) -> Path:
    path = tmp_path / "forget.txt"
    path.write_text("".join(f"{i}\n" for i in ids), encoding="utf-8")
    return path


def _version(store: Path) -> str:
    return json.loads((store / "manifest.json").read_text())["version"]


@pytest.fixture()
def store(base_store, tmp_path) -> Path:
    out = tmp_path / "store"
    shutil.copytree(base_store[1], out)
    return out


@pytest.mark.parametrize("content, message", [(b"", "empty"), ("x".encode("utf-16"), "UTF-16"),
                                              (b"\n\n   \n", "empty"), (b"\x00" * 64, "NUL")])
def test_unusable_input_publishes_nothing(store, tmp_path, content, message):
    before = _version(store)
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(content)
    for incremental in (True, False):
        res = _build(inp, store, incremental=incremental)
        assert res.exit_code == 2, res.output
        assert message in res.output and "Traceback" not in res.output
        assert _version(store) == before and len(list((store / "manifests").glob("v*.json"))) == 1
        # and no unpublished version directory is left behind (one was, per refused run)
        assert [p.name for p in (store / "versions").iterdir()] == [before]


def test_empty_directory_publishes_nothing(store, tmp_path):
    before = _version(store)
    (tmp_path / "exports").mkdir()
    res = _build(tmp_path / "exports", store)
    assert res.exit_code == 2 and "no input file" in res.output, res.output
    assert _version(store) == before


def test_missing_tenants_are_kept_unless_the_input_is_complete(store, tmp_path):
    m1 = json.loads((store / "manifest.json").read_text())
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(tenant_lines("dora")) + "\n", encoding="utf-8")  # 3 of 4 tenants missing
    res = _build(inp, store)
    assert res.exit_code == 0, res.output + repr(res.exception)
    m2 = json.loads((store / "manifest.json").read_text())
    assert m2["incremental"]["deleted"] == [] and m2["incremental"]["missing_kept"] == ["emil", "fay", "gus"]
    assert sorted(m2["tenants"]) == ALL and "missing from the input" in res.output
    kept = lambda m: [r for r in node_rows(store, m) if r[1] != "dora"]  # noqa: E731
    assert kept(m2) == kept(m1) and kept(m1)
    # declared complete: deleting 3 of 4 tenants is above the default share (0.1): refused
    res = _build(inp, store, "--input-is-complete")
    assert res.exit_code == 2 and "max_removed_share" in res.output, res.output
    assert _version(store) == m2["version"]
    res = _build(inp, store, "--input-is-complete", "--max-removed-share", "0.75")
    assert res.exit_code == 0, res.output
    m3 = json.loads((store / "manifest.json").read_text())
    assert sorted(m3["tenants"]) == ["dora"] and m3["incremental"]["deleted"] == ["emil", "fay", "gus"]
    assert {r[1] for r in node_rows(store)} == {"dora"}


def test_full_build_does_not_wipe_tenants_missing_from_its_input(store, tmp_path):
    before = _version(store)
    inp = write_jsonl(tmp_path / "in.jsonl", ["dora"])
    res = _build(inp, store, incremental=False)
    assert res.exit_code == 2 and "max_removed_share" in res.output, res.output
    assert _version(store) == before


def test_tenant_split_over_two_files_keeps_both_files_turns(ray_local, tmp_path):
    lines = tenant_lines("dora")  # conversations dora-a (8 turns) and dora-b (8 turns)
    a = [json.loads(x) for x in lines if '"dora-a"' in x]
    b = [json.loads(x) for x in lines if '"dora-b"' in x]
    dup = dict(a[0], text="the same turn id again, from the second file")
    d = tmp_path / "exports"
    d.mkdir()
    (d / "day1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in a), encoding="utf-8")
    (d / "day2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*b, dup]), encoding="utf-8")
    write_jsonl(d / "day3.jsonl", ["emil"])
    store = tmp_path / "store"
    res = _build(d, store)
    assert res.exit_code == 0, res.output + repr(res.exception)
    from memlib.io.store import StoreReader

    r = StoreReader(store)
    turns = r.table("turns", "dora").to_pylist()
    assert len(turns) == 16 and {t["conversation_id"] for t in turns} == {"dora-a", "dora-b"}
    assert next(t for t in turns if t["turn_id"] == a[0]["turn_id"] and t["conversation_id"] == "dora-a")[
        "text"] == a[0]["text"]
    m = json.loads((store / "manifest.json").read_text())
    assert m["tenants"]["dora"]["turns"] == 16 and m["tenants"]["dora"]["source"] == ["day1.jsonl", "day2.jsonl"]
    q = r.table("quarantine").to_pylist()
    assert [(x["reason_code"], x["tenant_id"]) for x in q] == [("duplicate_turn_id", "dora")]
    # unchanged files: nothing to publish; a new file naming dora again rebuilds dora only
    res = _build(d, store)
    assert res.exit_code == 0 and "unchanged" in res.output
    assert json.loads((store / "manifest.json").read_text())["version"] == m["version"]
    (d / "day4.jsonl").write_text(json.dumps(dict(b[0], session_id="s9", turn_id="s9:1",
                                                  session_time="2023-03-01T10:00:00+00:00",
                                                  text="Back from the regatta.")) + "\n", encoding="utf-8")
    res = _build(d, store)
    m = json.loads((store / "manifest.json").read_text())
    assert res.exit_code == 0 and m["incremental"]["built"] == ["dora"] and m["tenants"]["dora"]["turns"] == 17


def test_incremental_run_after_a_full_build_carries_every_tenant(ray_local, tmp_path):
    """A full build records the build key and input hashes the next nightly run
    compares against, so an unchanged input rebuilds nothing."""
    inp = write_jsonl(tmp_path / "in.jsonl", ["emil", "gus"])
    store = tmp_path / "store"
    res = _build(inp, store, incremental=False)
    assert res.exit_code == 0, res.output + repr(res.exception)
    full = json.loads((store / "manifest.json").read_text())
    assert full["build_key"] and all(t["input_hash"] for t in full["tenants"].values())
    res = _build(inp, store)
    assert res.exit_code == 0, res.output + repr(res.exception)
    plan = next(line for line in res.output.splitlines() if line.startswith("plan:"))
    assert "built 0" in plan and "carried 2" in plan and "unchanged" in res.output  # nothing to publish
    assert json.loads((store / "manifest.json").read_text())["version"] == full["version"]


SECRET_WORDS = ("nilla", "queen sacrifice", "obsidian trophy", "quetzalcoatl", "zugzwang", "pirc defence",
                "kasparov")


def _decoded(path: Path) -> str:
    """A store file as text: Parquet decoded (it is compressed), npz arrays listed, the rest as bytes."""
    import numpy as np
    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        return str(pq.read_table(path).to_pylist())
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            return " ".join(str(z[k].tolist()) for k in z.files)
    return path.read_bytes().decode("latin-1")


def _words_in_store(store: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for p in sorted(store.rglob("*")):
        if p.is_file():
            text = _decoded(p).lower()
            for w in SECRET_WORDS:
                if w in text:
                    found.setdefault(w, []).append(str(p.relative_to(store)))
    return found


def test_forget_and_compact_leave_no_word_of_the_tenant(ray_local, tmp_path):
    """After --delete and --compact no distinctive word of the forgotten tenant is
    in any decoded file of the store, including its quarantined records that could not be decoded."""
    gus = tenant_lines("gus")
    bad = [
        '{"tenant_id": "gus", "conversation_id": "gus-a", "turn_id": "x1", "text": "the obsidian trophy',
        json.dumps({"tenant_id": "gus", "conversation_id": "gus-a", "session_id": "s1", "turn_id": "x2",
                    "role": "user", "text": "Quetzalcoatl \udcff"}),
        '{"tenant_id": "gus", "conversation_id": "gus-a", "session_id": "s1", "turn_id": "x3", "role": "user", '
        '"text": "Zugzwang", "extras": {"x": ' + "[" * 5000 + "]" * 5000 + "}}",
        json.dumps({"tenant_id": "gus", "conversation_id": "gus-a", "session_id": "s1", "turn_id": "x4",
                    "session_time": "never", "role": "user", "text": "Kasparov opened with the Pirc defence"}),
    ]
    inp = tmp_path / "in.jsonl"
    raw = ("\n".join(tenant_lines("dora") + gus + bad + tenant_lines("emil")) + "\n").encode("utf-8", "surrogatepass")
    inp.write_bytes(raw.replace(b"Quetzalcoatl \\udcff", b"Quetzalcoatl \xff"))
    store = tmp_path / "store"
    assert _build(inp, store).exit_code == 0
    before = _words_in_store(store)
    assert set(before) == set(SECRET_WORDS), before  # the check can fail: every word was stored somewhere
    forget = tmp_path / "forget.txt"
    forget.write_text("gus\n", encoding="utf-8")
    res = _build(inp, store, "--delete", str(forget), "--compact")
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert _words_in_store(store) == {}
    assert {r[1] for r in node_rows(store)} == {"dora", "emil"}


def test_forgetting_a_tenants_every_conversation_removes_it(store, tmp_path):
    """--delete of each conversation of a tenant (not the tenant id) leaves nothing valid to build:
    it was reported 'every record quarantined' and kept as published, forgotten text included.
    Now the tenant is removed, named in the output, and no word of it stays published; a tenant
    that keeps another conversation keeps it."""
    inp = write_jsonl(tmp_path / "in.jsonl", ALL)
    res = _build(inp, store, "--delete", str(_forget_file(tmp_path, "dora/dora-a", "dora/dora-b", "fay/fay-b")))
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "REMOVED tenant dora" in res.output and "forgotten conversation(s) dora-a, dora-b" in res.output
    m = json.loads((store / "manifest.json").read_text())
    assert "dora" not in m["tenants"] and "dora" in m["incremental"]["deleted"] and not m["incremental"]["failed"]
    text = published_text(store)
    assert "Marigold" not in text and "Zanzibar" not in text and "bees on the roof" not in text
    assert {r[1] for r in node_rows(store)} == {"emil", "fay", "gus"}
    assert "Helsinki" in text  # fay's other conversation stays


def test_quarantined_records_never_shrink_a_published_tenant(store, tmp_path):
    """A nightly export whose date format broke for most of a tenant's turns: those records are
    quarantined (and named in the output), and the tenant is kept as published and reported failed
    (exit 3) instead of being rebuilt from the records left (it went from 16 turns to 8, exit 0).
    Another tenant's change in the same run is built."""
    before = json.loads((store / "manifest.json").read_text())
    lines = tenant_lines("dora") + tenant_lines("emil", " Again.") + tenant_lines("fay") + tenant_lines("gus")
    inp = _with_bad_dates(tmp_path / "in.jsonl", lines, "09.01.2024 kl. 19:12 CET-ish",
                          lambda r: r["tenant_id"] == "dora" and r["conversation_id"] == "dora-b")
    res = _build(inp, store)
    assert res.exit_code == 3, res.output + repr(res.exception)
    assert "FAILED tenant dora: 8 of its records were quarantined" in res.output, res.output
    assert "would drop 8 of its 16 published turns" in res.output
    assert "dora/dora-b/s1:1 (in.jsonl, line " in res.output and "bad_date" in res.output
    m = json.loads((store / "manifest.json").read_text())
    assert m["tenants"]["dora"]["status"] == "failed" and "emil" in m["incremental"]["built"]
    assert "dora" not in m["incremental"]["built"]
    dora = lambda m: [r for r in node_rows(store, m) if r[1] == "dora"]  # noqa: E731
    assert dora(m) == dora(before) and dora(before)
    assert any("Again." in r[3] for r in node_rows(store, m) if r[1] == "emil")
    # the kept tenant's rows are counted (the summary said 16 turns fewer than the store held)
    assert m["row_counts"]["turns"] == sum(m["tenants"][t]["turns"] for t in m["tenants"]) == 4 * 8 + 2 * 8
    assert m["row_counts"]["nodes"] == sum(m["nodes_by_kind"].values())
    res = run_cli(["inspect", "--store", str(store), "--json"])  # --json was ignored for a store
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    status = {t["tenant"]: t.get("failed") for t in doc["tenants"]}
    assert "quarantined" in status["dora"] and status["emil"] is None
    assert doc["version"] == m["version"] and doc["quarantine"]["by_reason"] == {"bad_date": 8}


def test_a_new_tenant_with_no_valid_record_is_not_published(store, tmp_path):
    """A tenant seen for the first time whose every record is bad is reported failed, exit 3, and
    is not published as a tenant with 0 nodes (a query for it said nothing was found)."""
    bad = [json.dumps({"tenant_id": "zed", "conversation_id": "z", "session_id": "s1", "turn_id": f"t{i}",
                       "role": "bot", "text": "hello"}) for i in range(3)]
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join([*(ln for t in ALL for ln in tenant_lines(t)), *bad]) + "\n", encoding="utf-8")
    res = _build(inp, store)
    assert res.exit_code == 3, res.output
    m = json.loads((store / "manifest.json").read_text())
    assert "zed" not in m["tenants"] and "zed" in m["incremental"]["failed"]
    assert "plan: built 4, " in res.output  # the four tenants (another recipe), and not zed


def test_a_failed_tenant_holding_a_forgotten_conversation_is_removed_whole(store, tmp_path):
    """Forget dora-a while half of dora-b's records are bad: dora cannot be rebuilt (the quarantine
    guard) and cannot be kept (its published version holds dora-a): it is removed, and nothing of
    it is left in the new version's files (the records that were valid included)."""
    inp = _with_bad_dates(tmp_path / "in.jsonl", [ln for t in ALL for ln in tenant_lines(t)], "not a date",
                          lambda r: r["conversation_id"] == "dora-b" and r["session_id"] == "s2")
    res = _build(inp, store, "--delete", str(_forget_file(tmp_path, "dora/dora-a")))
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "REMOVED tenant dora" in res.output and "4 of its records were quarantined" in res.output
    m = json.loads((store / "manifest.json").read_text())
    assert "dora" not in m["tenants"] and not list((store / "versions" / m["version"]).glob("*/dora.*"))
    assert "Marigold" not in published_text(store) and {r[1] for r in node_rows(store)} == {"emil", "fay", "gus"}


def test_an_input_whose_every_record_lacks_a_field_stops_before_ray(tmp_path, monkeypatch):
    """Before: a JSONL export with `content` instead of `text` started Ray, ran ~30 s
    and published a version with 0 tenants (exit 0)."""
    import jobs.builder.driver

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(jobs.builder.driver, "init_ray", no_ray)
    inp = tmp_path / "export.jsonl"
    recs = [json.loads(line) for line in tenant_lines("dora") + tenant_lines("emil")]
    inp.write_text("".join(json.dumps({("content" if k == "text" else k): v for k, v in r.items()}) + "\n"
                           for r in recs), encoding="utf-8")
    for incremental in (False, True):
        res = _build(inp, tmp_path / "store", incremental=incremental)
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(lines) == 1, res.output + repr(res.exception)
        assert "every record lacks `text`; the file has `content`" in lines[0]
        assert not (tmp_path / "store" / "manifest.json").exists()


def test_a_carried_tenant_whose_files_are_gone_is_rebuilt_or_failed_never_published_empty(ray_local, tmp_path):
    """With the published version's directory deleted, a nightly run said "carried"
    and published tenants with no rows, no edges and no graph, exit 0. Now a tenant the input holds is
    rebuilt from it, and one it does not hold fails by name (exit 3)."""
    from memlib.io.store import StoreReader

    inp = write_jsonl(tmp_path / "in.jsonl", ["emil", "gus"])
    store = tmp_path / "store"
    assert _build(inp, store).exit_code == 0
    shutil.rmtree(store / "versions" / "v000001")
    res = _build(inp, store)  # the same input: both tenants would have been carried
    assert res.exit_code == 0, res.output + repr(res.exception)
    m = json.loads((store / "manifest.json").read_text())
    assert m["incremental"]["built"] == ["emil", "gus"] and m["incremental"]["carried"] == []
    r = StoreReader(store)
    assert all(r.table("turns", t).num_rows and r.edges(t).num_rows and r.graph_bytes(t) for t in ("emil", "gus"))
    shutil.rmtree(store / "versions" / m["version"])
    res = _build(write_jsonl(tmp_path / "emil.jsonl", ["emil"]), store)  # gus is not in this input
    assert res.exit_code == 3, res.output
    m = json.loads((store / "manifest.json").read_text())
    assert m["incremental"]["built"] == ["emil"] and "published files are gone" in m["incremental"]["failed"]["gus"]
    assert "gus" in res.output and StoreReader(store).table("turns", "emil").num_rows
