"""A nightly run that appends a session to a tenant replaces only the Lance rows that changed,
and its store still equals a full build of the new input, importance
included."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.jobs.conftest import run_cli, tenant_lines

pytestmark = pytest.mark.ray

HAL = [
    "I restored a 1974 Vespa scooter in my garage over the winter.",
    "My sister Ines moved to Porto to study marine biology.",
    "We adopted a grey cat called Pilot from the shelter.",
    "I ran the Lisbon half marathon in one hour fifty minutes.",
    "Our choir is rehearsing the Faure Requiem for May.",
    "I planted three olive trees and a fig tree behind the house.",
    "My manager asked me to lead the billing rewrite.",
    "We spent a week hiking the Picos de Europa in September.",
    "I finally learned to bake sourdough with rye flour.",
    "My grandfather taught me to play backgammon on his balcony.",
    "I bought a used cello and started weekly lessons.",
    "The kids built a treehouse with a rope ladder last weekend.",
]
NEW = "I played my first cello recital at the community hall and my grandfather came to listen."


def _session(tenant: str, si: int, fact: str, day: int) -> list[str]:
    texts = [fact, "That sounds wonderful, tell me more.", f"It took a lot of patience: {fact.lower()}",
             "Thanks for sharing!"]
    return [json.dumps({"tenant_id": tenant, "conversation_id": f"{tenant}-a", "session_id": f"s{si}",
                        "session_time": f"2023-02-{day:02d}T10:00:00+00:00", "turn_id": f"s{si}:{ti}",
                        "speaker": tenant.title() if ti % 2 else "Bot", "role": "user" if ti % 2 else "assistant",
                        "text": text}) for ti, text in enumerate(texts, start=1)]


def _input(path: Path, appended: bool) -> Path:
    """Two tenants of the shared fixture and hal, with twelve sessions (and a thirteenth appended)."""
    lines = [ln for t in ("emil", "fay") for ln in tenant_lines(t)]
    facts = HAL + ([NEW] if appended else [])
    lines += [ln for si, fact in enumerate(facts, start=1) for ln in _session("hal", si, fact, si)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _rows(store: Path, manifest: dict | None = None):
    """Every node's columns (importance through the reader) sorted by node id, and its vectors."""
    from memlib import schema
    from memlib.io.store import StoreReader

    nodes = StoreReader(store, manifest).nodes(columns=[f.name for f in schema.NODES]).sort_by("node_id")
    emb = nodes.column("embedding").combine_chunks()
    return nodes.drop_columns(["embedding"]), emb.values.to_numpy(zero_copy_only=False).reshape(len(emb), -1)


def _row_ids(store: Path, version: int, tenant: str) -> dict[str, int]:
    from memlib.io.lance_tables import connect, sql_str

    tbl = connect(store).open_table("nodes")
    tbl.checkout(version)
    t = (tbl.search().where(f"tenant_id = {sql_str(tenant)}").select(["node_id"]).with_row_id(True)
         .limit(None).to_arrow())
    return dict(zip(t.column("node_id").to_pylist(), t.column("_rowid").to_pylist()))


def _build(inp: Path, store: Path, *extra: str):
    res = run_cli(["build", *extra, "--input", str(inp), "--format", "jsonl", "--out", str(store), "--num-cpus", "2"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    return json.loads((store / "manifest.json").read_text())


@pytest.fixture(scope="module")
def appended(ray_local, tmp_path_factory):
    d = tmp_path_factory.mktemp("lance_delta")
    store, full = d / "store", d / "full"
    before = _build(_input(d / "base.jsonl", False), store)
    inp = _input(d / "plus.jsonl", True)
    after = _build(inp, store, "--incremental")
    _build(inp, full)
    return {"store": store, "full": full, "before": before, "after": after}


def test_appended_session_rewrites_only_the_changed_lance_rows(appended):
    before, after = appended["before"], appended["after"]
    assert after["incremental"]["built"] == ["hal"]
    old = _row_ids(appended["store"], before["lance_version"], "hal")
    new = _row_ids(appended["store"], after["lance_version"], "hal")
    kept = [n for n in new if n in old and new[n] == old[n]]  # the same row of the same fragment
    written = [n for n in new if n not in kept]
    assert len(kept) > len(written) > 0, (len(kept), len(written))
    assert after["tenant_reused"]["hal"]["lance_rows_kept"] == len(kept)
    # every new turn was written; the published rows of the untouched tenants stay where they were
    from memlib.ids import turn_node_id

    assert {turn_node_id("hal", "hal-a", f"s13:{i}") for i in range(1, 5)} <= set(written)
    assert _row_ids(appended["store"], after["lance_version"], "fay") == _row_ids(
        appended["store"], before["lance_version"], "fay")


def test_appended_session_store_equals_a_full_build_importance_included(appended):
    a, va = _rows(appended["store"])
    b, vb = _rows(appended["full"])
    assert a.column("node_id").to_pylist() == b.column("node_id").to_pylist()
    for name in a.column_names:
        assert a.column(name).equals(b.column(name)), name
    assert float(np.abs(va - vb).max()) == 0.0
    imp = a.column("importance")
    assert imp.null_count == 0 and len(set(imp.to_pylist())) > 1
    # the Lance rows hold no importance: it is read from the node_importance table
    from memlib.io.lance_tables import connect

    tbl = connect(appended["store"]).open_table("nodes")
    tbl.checkout(appended["after"]["lance_version"])
    hal = tbl.search().where("tenant_id = 'hal'").select(["importance"]).limit(None).to_arrow()
    assert hal.column("importance").null_count == hal.num_rows
