import json
from pathlib import Path

import pytest

from memlib.llm.client import CallStatus, LLMClient
from memlib.llm.fake_server import Fault
from memlib.llm.limiter import NoLimit
from memlib.llm.models import FactsOut, Task
from tests.llm.conftest import API_KEY, llm_config

VARS = {"turns": "[0] Caroline: I started a pottery class in Portland last week with my sister.\n"
                 "[1] Melanie: That sounds lovely, what did you make first?",
        "session_date": "2023-05-08 (Monday)", "existing_facts": "(none)", "existing_concepts": "(none)",
        "related_episodes": "(none)"}


def _client(srv, tmp_path: Path, **llm) -> LLMClient:
    cfg = llm_config(srv.url, **llm)
    return LLMClient(cfg.llm, cache_dir=tmp_path / "cache", limiter=NoLimit(), seed=1)


@pytest.mark.parametrize("fault", [Fault.TIMEOUT, Fault.RATE_LIMIT, Fault.SERVER_ERROR,
                                   Fault.INVALID_JSON, Fault.TRUNCATED])
def test_transient_fault_is_retried_and_recorded(fake_server, tmp_path, fault):
    srv = fake_server(fault_rate=1.0, faults=(fault,), delay_s=1.0)
    client = _client(srv, tmp_path, max_retries=1)
    res = client.call(Task.FACTS, VARS, unit_id="u1", tenant_id="t")
    assert res.status is CallStatus.ERROR and res.output is None
    row = client.calls_table().to_pylist()[0]
    assert row["attempts"] == 2 and srv.state.chat_requests == 2
    assert row["error"].count("attempt") == 2
    srv.state.fault_rate = 0.0
    ok = client.call(Task.FACTS, VARS, unit_id="u1", tenant_id="t")
    assert ok.status is CallStatus.OK and isinstance(ok.output, FactsOut) and ok.output.facts


def test_retry_after_is_honoured(fake_server, tmp_path):
    srv = fake_server(fault_rate=1.0, faults=(Fault.RATE_LIMIT,), retry_after_s=0.3)
    slept = []
    cfg = llm_config(srv.url, max_retries=2)
    client = LLMClient(cfg.llm, limiter=NoLimit(), sleep=slept.append)
    client.call(Task.FACTS, VARS, unit_id="u", tenant_id="t")
    assert slept == [0.3, 0.3]


def test_wrong_schema_gets_one_repair(fake_server, tmp_path):
    srv = fake_server(fault_rate=1.0, faults=(Fault.WRONG_SCHEMA,))
    client = _client(srv, tmp_path, max_retries=3)
    res = client.call(Task.FACTS, VARS, unit_id="u", tenant_id="t")
    assert res.status is CallStatus.ERROR and srv.state.chat_requests == 2  # original + one repair
    assert "schema" in client.calls_table().column("error")[0].as_py()
    srv.state.fault_rate = 0.0
    srv.state.injected.clear()
    # a wrong answer followed by a good repair succeeds
    srv.state.fault_rate, srv.state.faults = 1.0, (Fault.WRONG_SCHEMA,)
    srv.state.rng.seed(0)
    calls = []
    orig = srv.state.pick_fault

    def once():
        f = orig()
        calls.append(f)
        return f if len(calls) == 1 else None
    srv.state.pick_fault = once
    res = client.call(Task.FACTS, dict(VARS, existing_facts="[0] x"), unit_id="u2", tenant_id="t")
    assert res.status is CallStatus.OK


def test_unchanged_rerun_makes_no_http_call_and_key_never_stored(fake_server, tmp_path):
    srv = fake_server()
    client = _client(srv, tmp_path)
    assert client.call(Task.FACTS, VARS, unit_id="u", tenant_id="t").status is CallStatus.OK
    n = srv.state.requests
    again = _client(srv, tmp_path)  # a fresh process would see the same cache directory
    res = again.call(Task.FACTS, VARS, unit_id="u", tenant_id="t")
    assert res.status is CallStatus.CACHED and srv.state.requests == n
    files = list((tmp_path / "cache").rglob("*.json"))
    assert files
    for f in files:
        text = f.read_text()
        assert API_KEY not in text and srv.url not in text and "127.0.0.1" not in text
        json.loads(text)
    calls = client.calls_table().to_pylist() + again.calls_table().to_pylist()
    assert API_KEY not in json.dumps(calls, default=str)


def test_cache_key_changes_with_model_and_prompt_vars(fake_server, tmp_path):
    srv = fake_server()
    a = _client(srv, tmp_path)
    a.call(Task.FACTS, VARS, unit_id="u", tenant_id="t")
    b = _client(srv, tmp_path, model="other-model")
    b.call(Task.FACTS, VARS, unit_id="u", tenant_id="t")
    a.call(Task.FACTS, dict(VARS, session_date="2024-01-01"), unit_id="u", tenant_id="t")
    assert srv.state.chat_requests == 3


def test_tokens_of_a_cut_off_reply_are_still_counted(fake_server, tmp_path):
    """A reply cut by max_tokens (finish_reason=length) is unusable but was paid for."""
    srv = fake_server(fault_rate=1.0, faults=(Fault.TRUNCATED,))
    client = _client(srv, tmp_path, max_retries=1)
    res = client.call(Task.FACTS, VARS, unit_id="u", tenant_id="t")
    assert res.status is CallStatus.ERROR and "finish_reason=length" in res.error
    row = client.calls_table().to_pylist()[0]
    assert row["attempts"] == 2
    assert row["prompt_tokens"] == srv.state.prompt_tokens > 0
    assert row["completion_tokens"] == srv.state.completion_tokens > 0


def test_a_damaged_cached_response_is_asked_again(fake_server, tmp_path):
    """Every kept LLM response carries a checksum; one whose bytes changed after it was
    written (still valid JSON) is a miss, and the call goes to the endpoint again."""
    srv = fake_server()
    client = _client(srv, tmp_path)
    first = client.call(Task.FACTS, VARS, unit_id="u", tenant_id="t")
    assert client.call(Task.FACTS, VARS, unit_id="u", tenant_id="t").status is CallStatus.CACHED
    [path] = (tmp_path / "cache").glob("*/*.json")
    entry = json.loads(path.read_text())
    assert entry["checksum"].startswith("sha256:")
    fact = entry["output"]["facts"][0]
    fact["text"] = fact["text"] + " (edited)"  # a change that still parses and validates
    path.write_text(json.dumps(entry))
    again = client.call(Task.FACTS, VARS, unit_id="u", tenant_id="t")
    assert again.status is CallStatus.OK and srv.state.chat_requests == 2
    assert again.output == first.output
    assert client.call(Task.FACTS, VARS, unit_id="u", tenant_id="t").status is CallStatus.CACHED


def test_a_response_cached_before_checksums_is_read_as_before(fake_server, tmp_path):
    srv = fake_server()
    client = _client(srv, tmp_path)
    client.call(Task.FACTS, VARS, unit_id="u", tenant_id="t")
    [path] = (tmp_path / "cache").glob("*/*.json")
    entry = json.loads(path.read_text())
    del entry["checksum"]
    path.write_text(json.dumps(entry))
    assert client.call(Task.FACTS, VARS, unit_id="u", tenant_id="t").status is CallStatus.CACHED
    assert srv.state.chat_requests == 1
