"""Fixtures of the llm area: the fake OpenAI-compatible server and small LoCoMo turn tables."""
from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from memlib.config import MemlibConfig
from memlib.llm.fake_server import FakeLLMServer

for _name in ("httpx", "httpx2", "openai"):
    logging.getLogger(_name).setLevel(logging.WARNING)

API_KEY = "sk-test-SECRET-4242"


@pytest.fixture
def fake_server():
    """Factory: ``fake_server(fault_rate=0.2, ...)`` -> a started server, stopped at teardown."""
    servers = []

    def make(**kw) -> FakeLLMServer:
        srv = FakeLLMServer(**kw).start()
        servers.append(srv)
        return srv
    yield make
    for s in servers:
        s.stop()


def llm_config(url: str, **llm) -> MemlibConfig:
    cfg = MemlibConfig()
    cfg.llm.base_url = url
    cfg.llm.api_key = API_KEY
    cfg.llm.requests_per_minute = 100_000
    cfg.llm.backoff_base_s = 0.01
    cfg.llm.backoff_max_s = 0.05
    cfg.llm.timeout_s = 0.5
    for k, v in llm.items():
        setattr(cfg.llm, k, v)
    return cfg


@pytest.fixture(scope="session")
def locomo_turns(locomo_path) -> pa.Table:
    from memlib.io.readers import read_input
    return read_input(locomo_path, "locomo").turns


@pytest.fixture(scope="session")
def few_sessions(locomo_turns) -> pa.Table:
    """The first 4 sessions of the first conversation."""
    t = locomo_turns
    first = t.column("tenant_id")[0]
    mask = pc.and_(pc.equal(t.column("tenant_id"), first), pc.less_equal(t.column("session_index"), 4))
    return t.filter(mask)
