"""The MCP server over streamable HTTP (the FastAPI app on uvicorn in a thread, no Ray), driven by
the official SDK's own client in both protocol eras; the explorer's JSON endpoints and static
page in-process."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from mcp.shared.exceptions import MCPError

from memlib.serve.app import build_app
from tests.serve.conftest import ADMIN, TOKENS, bearer, mcp_call, serve_config, write_version

MODES = ["auto", "legacy"]  # 2026-07-28 per-request envelopes; 2025-11-25 initialize handshake
SEARCH = {"query": "where did I go hiking", "k": 3, "strategy": "bm25"}


@contextmanager
def serving_app(service) -> Iterator[str]:
    """The app of ``service`` on uvicorn in a thread, at a free loopback port, for the block."""
    from jobs.serve import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(service), host="127.0.0.1", port=port, log_level="error"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        th.join(timeout=10)


@pytest.fixture(scope="module")
def shared_service(tmp_path_factory, embedder):
    """One started service over the synthetic store for the module's tests, which only read it."""
    from memlib.serve.service import SearchService

    store = tmp_path_factory.mktemp("mcp") / "store"
    write_version(store, embedder)
    svc = SearchService(store, serve_config(), embedder=embedder).start()
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def base_url(shared_service):
    with serving_app(shared_service) as url:
        yield url


@pytest.mark.parametrize("mode", MODES)
def test_tools_listed_and_search_points_to_real_turns(base_url, mode):
    async def calls(c):
        tools = await c.list_tools()
        return tools, await c.call_tool("search_memory", {**SEARCH, "tenant": "alice"})

    tools, res = mcp_call(base_url, TOKENS["alice"], calls, mode)
    assert {t.name for t in tools.tools} == {"search_memory", "list_tenants", "get_session"}
    search_tool = next(t for t in tools.tools if t.name == "search_memory")
    assert search_tool.input_schema["required"] == ["query"] and search_tool.annotations.read_only_hint
    assert not res.is_error
    top = res.structured_content["turns"][0]
    assert (top["turn_id"], top["session_id"], top["speaker"]) == ("a:1", "s1", "alice")
    text = res.content[0].text
    assert "[1] 2024-01-09 19:00 · session s1 · turn a:1 · alice: I went hiking in the Alps" in text


def test_search_memory_answers_what_v1_search_answers(base_url):
    """The tool runs the /v1/search code path: same nodes, turns, scores and packed context."""
    res = mcp_call(base_url, TOKENS["alice"], lambda c: c.call_tool("search_memory", {**SEARCH, "tenant": "alice"}))
    http = httpx.post(f"{base_url}/v1/search", json={**SEARCH, "tenant": "alice"}, headers=bearer(TOKENS["alice"]))
    assert http.status_code == 200
    mcp_body, http_body = res.structured_content, http.json()
    for key in ("results", "turns", "context", "version", "strategy", "k"):
        assert mcp_body[key] == http_body[key], key


def test_tenant_defaults_to_the_tokens_tenant_and_admin_must_name_one(base_url):
    res = mcp_call(base_url, TOKENS["bob"], lambda c: c.call_tool("search_memory", {"query": "bicycle"}))
    assert not res.is_error and res.structured_content["turns"][0]["turn_id"] == "b:1"

    async def admin_calls(c):
        return await c.call_tool("list_tenants", {}), await c.call_tool("search_memory", {"query": "bicycle"})

    tenants, unnamed = mcp_call(base_url, ADMIN, admin_calls)
    assert tenants.structured_content["tenants"] == ["alice", "bob"] and "alice, bob" in tenants.content[0].text
    assert unnamed.is_error and unnamed.content[0].text.startswith("malformed_body: tenant")


def test_get_session_returns_the_turns_around_a_hit(base_url):
    async def calls(c):
        return (await c.call_tool("get_session", {"session_id": "s1", "around": "a:2", "window": 1}),
                await c.call_tool("get_session", {"session_id": "s1", "around": "a:1", "window": 0}))

    wide, narrow = mcp_call(base_url, TOKENS["alice"], calls)
    assert [t["turn_id"] for t in wide.structured_content["turns"]] == ["a:1", "a:2"]
    assert wide.structured_content["n_turns"] == 2
    assert "> a:2 · alice: My favourite food is mushroom risotto" in wide.content[0].text
    assert [t["turn_id"] for t in narrow.structured_content["turns"]] == ["a:1"]


@pytest.mark.parametrize("tool,args,code", [
    ("search_memory", {"query": "x", "k": 0}, "bad_k"),
    ("search_memory", {"query": "x", "k": "5"}, "malformed_body"),
    ("search_memory", {"query": "x", "strategy": "nope"}, "unknown_strategy"),
    ("search_memory", {"query": "   "}, "malformed_body"),
    ("search_memory", {"k": 3}, "malformed_body"),
    ("search_memory", {"query": "x", "tenant": "../alice"}, "bad_tenant_id"),
    ("search_memory", {"query": "x", "colour": "red"}, "malformed_body"),
    ("get_session", {"session_id": "s9"}, "unknown_session"),
    ("get_session", {"session_id": "s1", "around": "b:1"}, "unknown_node"),
    ("get_session", {"session_id": "s1", "window": -1}, "bad_argument"),
    ("get_session", {}, "bad_argument"),
    ("list_tenants", {"tenant": "alice"}, "bad_argument"),
])
def test_bad_arguments_are_tool_errors_with_a_reason(base_url, tool, args, code):
    res = mcp_call(base_url, TOKENS["alice"], lambda c: c.call_tool(tool, args))
    assert res.is_error, res
    assert res.structured_content["error"] == code and res.content[0].text.startswith(f"{code}: ")
    assert len(res.content[0].text) > len(code) + 4


def test_unknown_tool_is_a_protocol_error(base_url):
    with pytest.raises(MCPError, match="unknown tool 'nope'"):
        mcp_call(base_url, TOKENS["alice"], lambda c: c.call_tool("nope", {}))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("token", [None, "not-a-token"])
def test_401_without_a_valid_token(base_url, mode, token):
    with pytest.raises(MCPError) as e:
        mcp_call(base_url, token, lambda c: c.list_tools(), mode)
    assert e.value.code == -32001 and e.value.data["error"] == "unauthenticated"
    headers = {"Accept": "application/json, text/event-stream"} | (bearer(token) if token else {})
    r = httpx.post(f"{base_url}/mcp", json={"jsonrpc": "2.0", "id": 5, "method": "tools/list"}, headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    # the token is checked before the body is read, so the answer cannot name the request's id (JSON-RPC: null)
    assert r.json()["id"] is None and r.json()["error"]["data"]["error"] == "unauthenticated"


@pytest.mark.parametrize("mode", MODES)
def test_403_for_another_tenant(base_url, mode):
    for tool, args in (("search_memory", {"query": "bicycle", "tenant": "bob"}),
                       ("get_session", {"session_id": "s1", "tenant": "bob"})):
        with pytest.raises(MCPError) as e:
            mcp_call(base_url, TOKENS["alice"], lambda c, tool=tool, args=args: c.call_tool(tool, args), mode)
        assert e.value.code == -32003 and e.value.data["error"] == "forbidden" and "'bob'" in e.value.message
    body = {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
            "params": {"name": "search_memory", "arguments": {"query": "bicycle", "tenant": "bob"}}}
    r = httpx.post(f"{base_url}/mcp", json=body, headers={"Accept": "application/json, text/event-stream",
                                                         **bearer(TOKENS["alice"])})
    assert r.status_code == 403 and r.json()["error"]["code"] == -32003
    # the admin token reaches bob
    res = mcp_call(base_url, ADMIN, lambda c: c.call_tool("search_memory", {"query": "bicycle", "tenant": "bob"}))
    assert not res.is_error and res.structured_content["turns"][0]["turn_id"] == "b:1"


def test_mcp_calls_are_counted_in_metrics(service):
    """On a service of its own: the counts are this test's calls alone."""
    with serving_app(service) as base_url:
        mcp_call(base_url, TOKENS["alice"], lambda c: c.call_tool("search_memory", {**SEARCH, "tenant": "alice"}))
        text = httpx.get(f"{base_url}/metrics").text
    assert 'memlib_requests_total{endpoint="mcp_search_memory",status="200",strategy="bm25"} 1.0' in text
    assert 'memlib_requests_total{endpoint="mcp",status="200",strategy="-"}' in text


# -- explorer endpoints and page (in-process) ---------------------------------------------------
@pytest.fixture(scope="module")
def client(shared_service):
    with TestClient(build_app(shared_service)) as c:
        yield c


def test_session_endpoint(client):
    r = client.get("/v1/session", params={"tenant": "alice", "session_id": "s1", "around": "a:2", "window": 0},
                   headers=bearer(TOKENS["alice"]))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["n_turns"] == 2 and [t["turn_id"] for t in body["turns"]] == ["a:2"]
    assert body["focus"] == body["turns"][0]["node_id"] and body["time"].startswith("2024-01-09")
    full = client.get("/v1/session", params={"tenant": "alice", "session_id": "s2"}, headers=bearer(ADMIN)).json()
    assert [t["text"] for t in full["turns"]] == ["Next month I start a pottery class on Tuesdays"]


@pytest.mark.parametrize("params,token,status,code", [
    ({"tenant": "alice", "session_id": "s1"}, None, 401, "unauthenticated"),
    ({"tenant": "alice", "session_id": "s1"}, TOKENS["bob"], 403, "forbidden"),
    ({"tenant": "carol", "session_id": "s1"}, ADMIN, 404, "unknown_tenant"),
    ({"tenant": "alice", "session_id": "s7"}, ADMIN, 404, "unknown_session"),
    ({"tenant": "alice", "session_id": "s1", "window": "many"}, ADMIN, 422, "bad_argument"),
    ({"tenant": "alice", "session_id": "s1", "window": 10_000}, ADMIN, 422, "bad_argument"),
    ({"tenant": "../x", "session_id": "s1"}, ADMIN, 422, "bad_tenant_id"),
    ({"tenant": "alice"}, ADMIN, 422, "bad_argument"),
])
def test_session_endpoint_errors(client, params, token, status, code):
    r = client.get("/v1/session", params=params, headers=bearer(token) if token else {})
    assert r.status_code == status and r.json()["error"] == code and r.json()["reason"], r.text


def test_graph_endpoint_rules(client):
    ok = client.get("/v1/graph", params={"tenant": "alice", "node": "a:1"}, headers=bearer(TOKENS["alice"]))
    assert ok.status_code == 200 and ok.json()["nodes"][0]["turn_ids"] == ["a:1"] and ok.json()["nodes"][0]["hops"] == 0
    assert client.get("/v1/graph", params={"tenant": "alice", "node": "a:1"},
                      headers=bearer(TOKENS["bob"])).status_code == 403
    r = client.get("/v1/graph", params={"tenant": "alice", "node": "zzz"}, headers=bearer(ADMIN))
    assert r.status_code == 404 and r.json()["error"] == "unknown_node"
    r = client.get("/v1/graph", params={"tenant": "alice", "node": "a:1", "depth": 9}, headers=bearer(ADMIN))
    assert r.status_code == 422 and r.json()["error"] == "bad_argument"


def test_openapi_documents_the_new_endpoints_and_ui_is_served(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/session", "/v1/graph", "/mcp", "/ui/"} <= set(paths)
    assert {p["name"] for p in paths["/v1/graph"]["get"]["parameters"]} >= {"tenant", "node", "depth", "limit"}
    page = client.get("/ui/")
    assert page.status_code == 200 and "memory explorer" in page.text and 'src="explorer.js"' in page.text
    assert client.get("/ui/explorer.js").status_code == 200 and client.get("/ui/explorer.css").status_code == 200
    assert client.get("/ui", follow_redirects=False).headers["location"] == "/ui/"
