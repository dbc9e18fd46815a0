"""Readers on the shared LoCoMo and LongMemEval files."""
from __future__ import annotations

import json

import polars as pl
import pytest

from memlib import schema
from memlib.io.readers import iter_tenants, read_input

LME_ORACLE = "longmemeval_oracle_2q_sample.json"
LME_S = "longmemeval_s_3haystacks_thirdparty_modified.json"


@pytest.fixture(scope="module")
def locomo(locomo_path):
    return read_input(locomo_path, "locomo")


def test_locomo_counts_match_stats(locomo, shared_data):
    stats = {c["sample_id"]: c for c in json.loads((shared_data / "locomo10_stats.json").read_text())["conversations"]}
    turns = pl.from_arrow(locomo.turns)
    per_conv = turns.group_by("tenant_id").agg(pl.len().alias("turns"), pl.col("session_id").n_unique().alias("s"),
                                               pl.col("extras").str.contains("blip_caption").sum().alias("img"))
    assert sorted(per_conv.get_column("tenant_id").to_list()) == ["conv-26", "conv-30", "conv-41"]
    for row in per_conv.iter_rows(named=True):
        want = stats[row["tenant_id"]]
        assert (row["turns"], row["s"], row["img"]) == (want["turns"], want["sessions"],
                                                       want["turns_with_image_caption"])
    q = pl.from_arrow(locomo.questions).group_by("tenant_id").len()
    assert dict(q.iter_rows()) == {k: stats[k]["qa"] for k in ("conv-26", "conv-30", "conv-41")}
    assert locomo.quarantine.num_rows == 0


def test_locomo_mapping(locomo):
    schema.check(locomo.turns, schema.TURNS, name="turns")
    schema.check(locomo.questions, schema.QUESTIONS, name="questions")
    first = locomo.turns.slice(0, 1).to_pylist()[0]
    assert (first["tenant_id"], first["session_id"], first["session_index"], first["turn_id"],
            first["turn_index"], first["role"]) == ("conv-26", "session_1", 1, "D1:1", 0, "user")
    assert first["session_time"].isoformat() == "2023-05-08T13:56:00+00:00"
    q0 = locomo.questions.slice(0, 1).to_pylist()[0]
    assert q0["question_id"] == "conv-26:q0" and q0["evidence"] == ["D1:3"]
    assert q0["evidence_sessions"] == ["session_1"]
    adversarial = pl.from_arrow(locomo.questions).filter(pl.col("category") == "5")
    assert adversarial.get_column("answer").null_count() == 0


def test_turns_sorted_and_indexed(locomo):
    df = pl.from_arrow(locomo.turns)
    assert df.equals(df.sort(["tenant_id", "conversation_id", "session_index", "turn_index"]))
    gaps = df.group_by(["tenant_id", "session_id"]).agg(
        (pl.col("turn_index").max() + 1 == pl.len()).alias("dense"))
    assert gaps.get_column("dense").all()
    assert df.get_column("node_id").n_unique() == df.height


def test_longmemeval_oracle_has_answer_evidence(shared_data):
    result = read_input(shared_data / LME_ORACLE, "longmemeval")
    raw = json.loads((shared_data / LME_ORACLE).read_text())
    assert result.summary()["tenants"] == 2
    turns = pl.from_arrow(result.turns)
    flagged = set(turns.filter(pl.col("extras").str.contains("has_answer")).get_column("turn_id").to_list())
    for inst in raw:
        q = pl.from_arrow(result.questions).filter(pl.col("tenant_id") == inst["question_id"]).row(0, named=True)
        want = [f"{sid}:{j}" for sid, sess in zip(inst["haystack_session_ids"], inst["haystack_sessions"])
                for j, t in enumerate(sess) if t.get("has_answer")]
        assert want and q["evidence"] == want and set(want) <= flagged
        assert q["evidence_sessions"] == inst["answer_session_ids"]
        assert q["category"] == inst["question_type"] and q["question_time"] is not None
        n = sum(len(s) for s in inst["haystack_sessions"])
        assert turns.filter(pl.col("tenant_id") == inst["question_id"]).height == n


def test_longmemeval_thirdparty_variant(shared_data):
    results = list(iter_tenants(shared_data / LME_S, "longmemeval"))
    assert [r.tenant_ids for r in results] == [["852ce960"], ["ba358f49"], ["6a1eabeb"]]
    total = sum(r.turns.num_rows + r.quarantine.num_rows for r in results)
    assert total == 396 + 409 + 413
    q = pl.from_arrow(results[0].questions)
    assert q.height == 9 and q.get_column("question_id").to_list()[0] == "852ce960:0"
    assert q.row(0, named=True)["evidence"]  # index 0 is the original question: flagged turns
    assert all(r.quarantine.column("reason_code").to_pylist() in ([], ["oversize_turn"]) for r in results)
