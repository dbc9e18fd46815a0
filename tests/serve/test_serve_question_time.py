"""A request's ``question_time`` over real HTTP and MCP (the app on uvicorn in a thread, no Ray): `auto`
resolves the question's relative dates against it, a bad value is a 422 naming it, and the MCP
``search_memory`` tool lists it."""
from __future__ import annotations

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from tests.serve.conftest import ADMIN, TOKENS, bearer, mcp_call, serve_config, write_version
from tests.serve.test_serve_mcp import serving_app

QUESTION = "where did I go hiking three days ago"  # the sessions are of 2024-01-09


@pytest.fixture(scope="module")
def base_url(tmp_path_factory, embedder):
    from memlib.serve.service import SearchService

    store = tmp_path_factory.mktemp("qtime") / "store"
    write_version(store, embedder)
    svc = SearchService(store, serve_config(), embedder=embedder).start()
    with serving_app(svc) as url:
        yield url
    svc.stop()


def _search(url: str, **body) -> httpx.Response:
    payload = {"tenant": "alice", "query": QUESTION, "strategy": "auto", "k": 3, **body}
    return httpx.post(f"{url}/v1/search", json=payload, headers=bearer(TOKENS["alice"]), timeout=60)


def _in_window(resp: httpx.Response) -> list[bool]:
    assert resp.status_code == 200, resp.text
    return [r["signals"].get("time_window", 0.0) > 0 for r in resp.json()["results"]]


def test_question_time_anchors_relative_dates(base_url):
    # three days before 2024-01-12 is the sessions' day: every turn is in the question's window
    assert all(_in_window(_search(base_url, question_time="2024-01-12T10:00:00Z")))
    assert all(_in_window(_search(base_url, question_time="2024-01-12")))  # a date alone: its midnight, UTC
    # without one, the tenant's latest turn time (2024-01-09) anchors it: three days before holds no turn
    assert not any(_in_window(_search(base_url)))
    assert not any(_in_window(_search(base_url, question_time="2025-06-01T00:00:00+02:00")))


@pytest.mark.parametrize("value", ["yesterday", "2024-13-01", "12/01/2024", ""])
def test_bad_question_time_is_a_422_naming_it(base_url, value):
    r = _search(base_url, question_time=value)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "bad_argument" and "question_time" in r.json()["reason"]


def test_question_time_of_the_wrong_type_or_length(base_url):
    for value in (20240112, "2024-01-12" + "x" * 80):
        r = _search(base_url, question_time=value)
        assert r.status_code == 422 and "question_time" in r.json()["reason"], r.text


def test_strategies_without_dates_take_it_and_ignore_it(base_url):
    a = _search(base_url, strategy="bm25").json()["results"]
    b = _search(base_url, strategy="bm25", question_time="2024-01-12").json()["results"]
    assert [r["node_id"] for r in a] == [r["node_id"] for r in b]


def test_mcp_search_memory_takes_question_time(base_url):
    async def calls(c):
        tools = await c.list_tools()
        hit = await c.call_tool("search_memory", {"query": QUESTION, "strategy": "auto", "k": 3,
                                                  "question_time": "2024-01-12T10:00:00Z"})
        return tools, hit

    tools, hit = mcp_call(base_url, TOKENS["alice"], calls)
    schema = next(t for t in tools.tools if t.name == "search_memory").input_schema
    assert schema["properties"]["question_time"]["type"] == "string"
    results = hit.structured_content["results"]
    assert results and all(r["signals"].get("time_window", 0.0) > 0 for r in results)

    async def bad(c):
        return await c.call_tool("search_memory", {"query": QUESTION, "tenant": "alice", "question_time": "soon"})

    try:
        res = mcp_call(base_url, ADMIN, bad)
    except MCPError as exc:  # a protocol error in one era, a tool error in the other
        assert "question_time" in str(exc)
    else:
        assert res.is_error and "question_time" in res.content[0].text
