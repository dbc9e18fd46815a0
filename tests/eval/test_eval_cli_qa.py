from __future__ import annotations

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from jobs.cli import app
from memlib.config import MemlibConfig
from memlib.eval.qa import key_facts, maybe_score_qa
from memlib.eval.questions import Dataset
from memlib.eval.runner import evaluate
from memlib.io.store import StoreReader
from tests.conftest import JsonHandler, serving
from tests.eval.conftest import TENANT


class _FakeOpenAI(JsonHandler):
    """Answers 'golden retriever' to questions about Biscuit, else 'unknown'; the judge covers
    fact 0 when the answer contains 'golden', else nothing."""

    def do_POST(self):  # noqa: N802 - http.server naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        system = body["messages"][0]["content"]
        if system.startswith("Grade"):
            answer = body["messages"][-1]["content"].split("Answer:")[-1]
            hit = "golden" in answer
            content = json.dumps({"covered": [0] if hit else [], "correct": hit})
        else:
            asked = body["messages"][-1]["content"].split("Question:")[-1]
            content = json.dumps({"answer": "golden retriever" if "Biscuit" in asked else "unknown"})
        out = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
               "choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": content}}],
               "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
        self.send_json(200, out)


@pytest.fixture()
def fake_llm():
    with serving(_FakeOpenAI) as url:
        yield url


def test_key_facts_split():
    assert key_facts("Paris; Berlin") == ["Paris", "Berlin"]
    assert key_facts(2022) == ["2022"]


def test_qa_skipped_without_endpoint(tiny_store, hash_embedder):
    run = evaluate(tiny_store, StoreReader(tiny_store).table("questions"), ["bm25"], [5], MemlibConfig(),
                   dataset=Dataset.LOCOMO, embedder=hash_embedder)
    assert maybe_score_qa(run, MemlibConfig(), None, None) is None
    note = maybe_score_qa(run, MemlibConfig(), "m", None)
    assert "skipped" in note and "qa_coverage" not in run.per_question.columns


def test_qa_against_fake_openai_server(tiny_store, hash_embedder, fake_llm):
    cfg = MemlibConfig()
    cfg.llm.base_url = fake_llm
    cfg.llm.max_retries = 1
    run = evaluate(tiny_store, StoreReader(tiny_store).table("questions"), ["bm25"], [5], cfg,
                   dataset=Dataset.LOCOMO, embedder=hash_embedder)
    note = maybe_score_qa(run, cfg, "answerer", "judge")
    assert note.startswith("QA scored 3")
    pq = run.per_question
    cov = dict(zip(pq.get_column("question_id"), pq.get_column("qa_coverage")))
    assert cov["q1"] == 1.0 and cov["q2"] == 0.0
    assert run.metrics["strategies"]["bm25"]["qa_coverage"] == pytest.approx(0.5)


def test_cli_eval_and_query(tiny_store, tmp_path):
    runner = CliRunner()
    out = tmp_path / "ev"
    res = runner.invoke(app, ["eval", "--store", str(tiny_store), "--format", "locomo", "--strategies", "bm25",
                              "--k", "1,5", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "| bm25 |" in res.output and (out / "metrics.json").exists()
    assert pl.read_parquet(out / "per_question.parquet").height == 3
    res = runner.invoke(app, ["query", "--store", str(tiny_store), "--tenant", TENANT, "--strategy", "bm25",
                              "--k", "2", "Biscuit golden retriever"])
    assert res.exit_code == 0, res.output
    assert "D1:3" in res.output and "packed context" in res.output
    res = runner.invoke(app, ["eval", "--store", str(tiny_store), "--strategies", "nope"])
    assert res.exit_code == 2 and "known strategies" in res.output


def test_demo_top_turns_by_default_strategy(tiny_store, hash_embedder):
    from jobs.cli.cmd_demo import top_turns

    cfg = MemlibConfig()
    assert cfg.retrieve.default_strategy == "auto"
    cfg.retrieve.params["auto"] = {"disk_cache": False}
    out = top_turns(tiny_store, cfg, hash_embedder, TENANT, "Where does Ann's sister play violin?", ["D2:2"], k=3)
    lines = out.splitlines()
    assert len(lines) == 3
    assert lines[0].split()[1] == "*D2:2" and "Berlin" in lines[0]
    assert sum("*" in line for line in lines) == 1


def test_a_strategy_that_raises_is_named_and_the_others_are_scored(tiny_store, tmp_path, monkeypatch):
    """`memlib eval` over several strategies: one that raises on a question is reported with its
    tenant, question and error, the others are still scored and written, and the exit code is 1.
    The Python API raises :class:`StrategyFailed` unless asked to keep going."""
    from memlib.eval.runner import StrategyFailed
    from memlib.retrieve import registry
    from memlib.retrieve.baselines import BM25

    class Broken(BM25):
        def search(self, tenant, query, k, **params):
            if "violin" in query:
                raise ValueError("index out of range in the broken strategy")
            return super().search(tenant, query, k, **params)

    registry.discover()
    monkeypatch.setitem(registry._REGISTRY, "broken", Broken)
    out = tmp_path / "ev"
    res = CliRunner().invoke(app, ["eval", "--store", str(tiny_store), "--format", "locomo",
                                   "--strategies", "bm25,broken", "--k", "1,5", "--out", str(out)])
    assert res.exit_code == 1, res.output
    assert "| bm25 |" in res.output and "| broken |" not in res.output
    assert "strategy `broken` failed" in res.output and "index out of range" in res.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert list(metrics["strategies"]) == ["bm25"]
    failed = metrics["failed"]["broken"]
    assert failed["tenant_id"] == TENANT and "ValueError" in failed["error"] and failed["question_id"]
    assert pl.read_parquet(out / "per_question.parquet").get_column("strategy").unique().to_list() == ["bm25"]
    assert "failed, not scored" in (out / "report.md").read_text()
    with pytest.raises(StrategyFailed, match="broken.*ValueError"):
        evaluate(tiny_store, StoreReader(tiny_store).table("questions"), ["bm25", "broken"], [5], MemlibConfig(),
                 dataset=Dataset.LOCOMO)
