"""Auth, request parsing and the bench load loop without Ray (uvicorn in a thread)."""
from __future__ import annotations

import threading
import time

import pytest
import uvicorn

from jobs.bench.serve_load import load_questions, run_load, run_paired, warmup_questions
from memlib.serve.app import build_app
from memlib.serve.auth import AuthConfigError, Authorizer, Role, hash_token
from memlib.serve.errors import ApiError, ErrorCode
from memlib.serve.requests import Limits, parse_search
from memlib.serve.service import SearchService
from tests.serve.conftest import ADMIN, TOKENS, serve_config

LIMITS = Limits(max_body_bytes=1000, max_k=50, default_k=10, default_strategy="bm25")


def test_hash_token_is_sha256_hex():
    assert hash_token("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_authorizer_roles_and_config_checks():
    auth = Authorizer({"alice": hash_token("a")}, hash_token("root"))
    assert auth.authenticate("Bearer a").tenant == "alice"
    assert auth.authenticate("bearer root").role is Role.ADMIN
    assert Authorizer({}, None, enabled=False).authenticate(None).role is Role.OPEN
    with pytest.raises(ApiError) as e:
        auth.authenticate("Bearer b")
    assert e.value.status == 401
    with pytest.raises(AuthConfigError, match="plaintext"):
        Authorizer({"alice": "my-secret-token"}, None)
    with pytest.raises(AuthConfigError, match="tenant id"):
        Authorizer({"../x": hash_token("a")}, None)
    with pytest.raises(AuthConfigError, match="share"):
        Authorizer({"a": hash_token("t"), "b": hash_token("t")}, None)


def test_parse_search_fills_defaults_and_rejects_bools():
    req = parse_search(b'{"tenant": "alice", "query": "hi"}', LIMITS, {"bm25"})
    assert (req.strategy, req.k) == ("bm25", 10)
    with pytest.raises(ApiError) as e:
        parse_search(b'{"tenant": "alice", "query": "hi", "k": true}', LIMITS, {"bm25"})
    assert e.value.code is ErrorCode.MALFORMED_BODY
    with pytest.raises(ApiError) as e:
        parse_search(b'{"tenant": "a\\u0000b", "query": "hi"}', LIMITS, {"bm25"})
    assert e.value.code is ErrorCode.BAD_TENANT_ID


@pytest.mark.heavy
def test_bench_load_loop_against_a_live_app(store, embedder):
    from jobs.serve import free_port

    svc = SearchService(store, serve_config(), embedder=embedder).start()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(svc), host="127.0.0.1", port=port, log_level="error"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        questions = load_questions(store)
        assert {t for t, _ in questions} == {"alice", "bob"}
        warm = warmup_questions(questions, extra=3)
        assert [t for t, _ in warm[:2]] == sorted({t for t, _ in questions}, key=[t for t, _ in questions].index)
        assert warm[2:] == questions[:3]
        url = f"http://127.0.0.1:{port}"
        figures, errors = run_load(url, ADMIN, "bm25", questions, 40, 4, 5, 60)
        assert errors == [] and figures["requests"] == 40 and figures["qps"] > 0
        assert 0 < figures["p50_ms"] <= figures["p95_ms"] <= figures["p99_ms"]
        _, errors = run_load(url, TOKENS["alice"], "bm25", questions, 8, 2, 5, 60)
        assert len(errors) == 4 and all(e.startswith("403") for e in errors)  # bob's questions are forbidden
        arms, errors = run_paired(url, ADMIN, "bm25", questions, 24, 2, 5, 120)
        assert errors == [] and [arms[a]["requests"] for a in ("http", "mcp_wire", "mcp")] == [24, 24, 24]
        assert all(0 < f["p50_ms"] <= f["p95_ms"] and f["qps"] > 0 for f in arms.values())
        _, errors = run_paired(url, TOKENS["alice"], "bm25", questions, 8, 2, 5, 60)
        assert sum(e.startswith("403") for e in errors) == 4  # /v1/search arm
        assert sum(e.startswith("mcp wire 403") and "forbidden" in e for e in errors) == 4
        assert sum(e.startswith("mcp MCPError") and "forbidden" in e for e in errors) == 4
    finally:
        server.should_exit = True
        th.join(timeout=10)
        svc.stop()


def test_replica_options_carry_the_thread_settings():
    from jobs.serve import replica_options

    cfg = serve_config()
    env = replica_options(cfg)["runtime_env"]["env_vars"]
    assert env["OPENBLAS_NUM_THREADS"] == "1" and env["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"
    cfg.serve.handlers_on_main_loop, cfg.serve.blas_threads = False, None
    assert "runtime_env" not in replica_options(cfg)
