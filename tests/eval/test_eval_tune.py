"""The cross-validated tuning protocol of ``memlib tune`` (memlib/eval/tune.py, crossval.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone

import polars as pl
import pyarrow as pa
import pytest

from memlib import ids
from memlib.eval import crossval, tune
from memlib.io.store import StoreWriter
from tests.conftest import REPO

TYPES = ["knowledge-update", "multi-session", "single-session-assistant", "single-session-preference",
         "single-session-user", "temporal-reasoning"]


def _frame(per_tenant: dict[str, float], n: int = 4, metric: str = "turn_recall@10") -> pl.DataFrame:
    rows = [{"tenant_id": t, "question_id": f"{t}-{i}", "category": "1", metric: v}
            for t, v in per_tenant.items() for i in range(n)]
    return tune.assign_folds(pl.DataFrame(rows), 3)


def test_grid_is_the_product_in_order_with_json_values():
    grid = tune.parse_grid(["a=0,0.5", "b=true,x"])
    assert grid == [{"a": 0, "b": True}, {"a": 0, "b": "x"}, {"a": 0.5, "b": True}, {"a": 0.5, "b": "x"}]
    with pytest.raises(ValueError, match="key=v1"):
        tune.parse_grid(["a"])


def test_folds_hold_whole_conversations():
    rows = [{"tenant_id": t, "question_id": f"{t}-{i}", "category": str(1 + i % 4)}
            for t in ("conv-41", "conv-26", "conv-30") for i in range(10)]
    folded = tune.assign_folds(pl.DataFrame(rows), 3)
    per_tenant = folded.group_by("tenant_id").agg(pl.col("fold").unique())
    assert {t: f.to_list() for t, f in zip(per_tenant["tenant_id"], per_tenant["fold"])} == {
        "conv-26": [0], "conv-30": [1], "conv-41": [2]}


def test_longmemeval_folds_are_stratified_by_question_type():
    rows = [{"tenant_id": f"{t}-{i}", "question_id": f"{t}-{i}", "category": t} for t in TYPES for i in range(4)]
    folded = tune.assign_folds(pl.DataFrame(rows), 3)
    sizes = folded.group_by("fold").len().sort("fold")["len"].to_list()
    assert sizes == [8, 8, 8]
    for f in range(3):
        assert set(folded.filter(pl.col("fold") == f)["category"].to_list()) == set(TYPES)


def test_held_out_conversation_never_picks_its_own_configuration():
    # config 0 is perfect on conv-c only; config 1 is a steady 0.5. On all data config 0 wins
    # (in-sample 0.53), but the fold that scores conv-c must choose on conv-a and conv-b alone.
    special = crossval.Scored("locomo", ("turn_recall@10",),
                              [_frame({"conv-a": 0.3, "conv-b": 0.3, "conv-c": 1.0}),
                               _frame({"conv-a": 0.5, "conv-b": 0.5, "conv-c": 0.5})])
    assert crossval.best([special], None)[0] == 0
    folds, pooled = crossval.cross_validate([special], 3)
    assert [f.chosen for f in folds] == [0, 0, 1]  # folds 0, 1 hold out conv-a, conv-b
    assert folds[2].held_out["locomo"]["turn_recall@10"] == pytest.approx(0.5)
    cv = pooled["locomo"]
    assert cv.height == 12 and cv["question_id"].n_unique() == 12
    assert cv["turn_recall@10"].mean() == pytest.approx((0.3 + 0.3 + 0.5) / 3)


def test_one_configuration_for_both_datasets():
    # config 0 is best on locomo, config 1 on longmemeval; the mean of the two decides, per fold
    loc = crossval.Scored("locomo", ("turn_recall@10",), [_frame({"a": 0.9, "b": 0.9, "c": 0.9}),
                                                         _frame({"a": 0.8, "b": 0.8, "c": 0.8})])
    lme = crossval.Scored("longmemeval", ("turn_recall@5",),
                          [_frame({f"q{i}": 0.5 for i in range(6)}, 1, "turn_recall@5"),
                           _frame({f"q{i}": 0.7 for i in range(6)}, 1, "turn_recall@5")])
    assert crossval.objective([loc, lme], 0, None) == pytest.approx(0.7)
    assert crossval.objective([loc, lme], 1, None) == pytest.approx(0.75)
    folds, _ = crossval.cross_validate([loc, lme], 3)
    assert all(f.chosen == 1 for f in folds)


TEXTS = ["I adopted a puppy named Biscuit last week", "That is lovely, what breed is Biscuit?",
         "A golden retriever, he loves the beach", "I started learning the violin in March",
         "My sister plays violin in an orchestra in Berlin", "I want to visit Berlin next summer"]


def _store(path):
    w = StoreWriter(path, dim=8)
    when = datetime(2023, 5, 7, tzinfo=timezone.utc)
    nodes, manifest = [], {}
    for t in ("conv-a", "conv-b", "conv-c"):
        turns = [dict(tenant_id=t, conversation_id=t, session_id=f"S{1 + i // 3}", session_index=1 + i // 3,
                      session_time=when, turn_id=f"D{1 + i // 3}:{i % 3 + 1}", turn_index=i,
                      node_id=ids.turn_node_id(t, t, f"D{1 + i // 3}:{i % 3 + 1}"), speaker="Ann", role="user",
                      text=f"Ann: {x}", content_hash=ids.content_hash(x), extras=None) for i, x in enumerate(TEXTS)]
        w.write_table("turns", t, pa.Table.from_pylist(turns))
        w.write_table("questions", t, pa.Table.from_pylist([
            dict(tenant_id=t, question_id=f"{t}-q1", question="What breed is the puppy Biscuit?", answer="golden",
                 category="1", evidence=["D1:3"], evidence_sessions=["S1"]),
            dict(tenant_id=t, question_id=f"{t}-q2", question="Where does the sister play violin?", answer="Berlin",
                 category="4", evidence=["D2:2"], evidence_sessions=["S2"])]))
        nodes += [dict(node_id=r["node_id"], tenant_id=t, conversation_id=t, kind="turn", text=r["text"],
                       time=when, session_id=r["session_id"], provenance=[r["node_id"]], embedding=[0.0] * 7 + [1.0])
                  for r in turns]
        manifest[t] = {"turns": len(turns)}
    w.replace_tenant_nodes(["conv-a", "conv-b", "conv-c"], pa.Table.from_pylist(nodes))
    w.index_nodes()
    w.publish({"tenants": manifest})
    return path


@pytest.mark.heavy
def test_tune_command_end_to_end(tmp_path):
    store = _store(tmp_path / "store")
    out = tmp_path / "tune"
    cmd = [sys.executable, "-m", "jobs.cli", "tune", "--data", f"locomo:{store}", "--strategy", "auto",
           "--grid", "session_weight=0,0.5", "--grid", "adjacent_weight=0", "--out", str(out),
           "--set", f"retrieve.params.auto.cache_dir=\"{tmp_path / 'late'}\""]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    res = json.loads((out / "tune.json").read_text())
    assert [f["held_out_tenants"]["locomo"] for f in res["folds"]] == [["conv-a"], ["conv-b"], ["conv-c"]]
    assert res["n_configs"] == 2 and res["cross_validated"]["locomo"]["n_questions"] == 6
    assert "Cross-validated figures" in run.stdout and (out / "tune.md").exists()
    assert len(list((out / "cache").glob("auto-locomo-*.parquet"))) == 2
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)  # from the cache
    assert again.returncode == 0 and "done" not in again.stderr
