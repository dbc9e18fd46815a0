"""The MCP server and the memory explorer page through the real Ray Serve app on loopback, over
a store built by `memlib build` (full recipe): the SDK's client against /mcp, the derived graph
of a hit against the store's edges, and the /ui page in headless Chromium (one Serve start-up)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from memlib.io.store import StoreReader, read_manifest
from tests.serve.browser import chromium_page
from tests.serve.conftest import ADMIN, SAMPLE_TOKENS, mcp_call, sample_serve_config

pytestmark = pytest.mark.ray
QUESTION = "does Maya eat coriander?"


@pytest.fixture(scope="module")
def serve_url(full_store, request):
    request.getfixturevalue("ray_local")
    from ray import serve

    from jobs.serve import free_port, start

    url = start(full_store, sample_serve_config(), host="127.0.0.1", port=free_port(), timeout_s=600)
    yield url
    serve.shutdown()


def turns_of(store: Path, tenant: str) -> dict[str, dict]:
    cols = ["node_id", "turn_id", "session_id", "session_time", "speaker", "text"]
    return {r["turn_id"]: r for r in StoreReader(store).table("turns", tenant, columns=cols).to_pylist()}


def test_mcp_search_through_serve_points_to_real_turns(serve_url, full_store):
    async def calls(c):
        tools = await c.list_tools()
        hit = await c.call_tool("search_memory", {"query": QUESTION, "k": 5, "strategy": "auto"})
        top = hit.structured_content["turns"][0]
        return tools, hit, await c.call_tool("get_session", {"session_id": top["session_id"], "around": top["turn_id"]})

    tools, hit, session = mcp_call(serve_url, SAMPLE_TOKENS["maya"], calls)
    assert {t.name for t in tools.tools} == {"search_memory", "list_tenants", "get_session"}
    body = hit.structured_content
    assert not hit.is_error and body["version"] == read_manifest(full_store)["version"] and body["turns"]
    turns = turns_of(full_store, "maya")
    for t in body["turns"]:
        real = turns[t["turn_id"]]
        assert (t["node_id"], t["text"], t["session_id"]) == (real["node_id"], real["text"], real["session_id"])
        assert t["time"] == real["session_time"].isoformat()
    coriander = next(t for t in body["turns"] if "coriander" in t["text"])
    assert f"turn {coriander['turn_id']} · Maya: {coriander['text']}" in hit.content[0].text
    assert session.structured_content["focus"] == body["turns"][0]["node_id"]
    assert all(turns[t["turn_id"]]["session_id"] == body["turns"][0]["session_id"]
               for t in session.structured_content["turns"])


def test_mcp_401_and_403_through_serve(serve_url):
    accept = {"Accept": "application/json, text/event-stream"}
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "search_memory", "arguments": {"query": QUESTION, "tenant": "maya"}}}
    assert httpx.post(f"{serve_url}/mcp", json=call, headers=accept).status_code == 401
    r = httpx.post(f"{serve_url}/mcp", json=call, headers={**accept, "Authorization": f"Bearer {SAMPLE_TOKENS['raj']}"})
    assert r.status_code == 403 and r.json()["error"]["data"]["error"] == "forbidden"
    with pytest.raises(MCPError) as e:
        mcp_call(serve_url, SAMPLE_TOKENS["raj"],
                 lambda c: c.call_tool("search_memory", {"query": "x", "tenant": "maya"}))
    assert e.value.code == -32003
    with pytest.raises(MCPError) as e:
        mcp_call(serve_url, "wrong-token", lambda c: c.list_tools())
    assert e.value.code == -32001
    for mode in ("auto", "legacy"):  # 2026-07-28 envelopes and the 2025-11-25 handshake, through Serve
        tenants = mcp_call(serve_url, ADMIN, lambda c: c.call_tool("list_tenants", {}), mode)
        assert tenants.structured_content["tenants"] == ["elena", "maya", "raj", "tomas-lena"]


def test_graph_of_a_hit_is_the_stores_derived_memory(serve_url, full_store):
    turns = turns_of(full_store, "maya")
    turn = next(t for t in turns.values() if "coriander" in t["text"] and t["speaker"] == "Maya")
    r = httpx.get(f"{serve_url}/v1/graph", params={"tenant": "maya", "node": turn["turn_id"], "limit": 200},
                  headers={"Authorization": f"Bearer {SAMPLE_TOKENS['maya']}"})
    assert r.status_code == 200, r.text
    graph = r.json()
    assert graph["center"] == turn["node_id"] and not graph["truncated"]
    edges = StoreReader(full_store).table("edges", "maya", columns=["src", "dst", "kind"]).to_pylist()
    stored = {(e["src"], e["dst"], e["kind"]) for e in edges}
    derived = {e["src"] for e in edges if e["dst"] == turn["node_id"] and e["kind"] == "DERIVED_FROM"}
    kinds = {n["node_id"]: n["kind"] for n in graph["nodes"]}
    assert derived and derived <= set(kinds), "every node derived from the turn is drawn"
    assert "fact" in {kinds[n] for n in derived}
    assert all((e["src"], e["dst"], e["kind"]) in stored for e in graph["edges"])
    assert {(n, turn["node_id"], "DERIVED_FROM") for n in derived} <= {(e["src"], e["dst"], e["kind"])
                                                                        for e in graph["edges"]}


def test_the_landing_page_says_where_a_token_comes_from(serve_url, tmp_path):
    """A first visit (no token in the tab) to a service with tokens: the page names the command that
    prints a token, the config keys its hash goes in, and --open-local for a store of one's own."""
    with chromium_page(800) as (page, _):
        page.goto(f"{serve_url}/ui/")
        page.wait_for_selector("#welcome:not([hidden])")
        page.wait_for_function("document.querySelector('#status').textContent === 'not connected'")
        hint = page.inner_text("#welcome")
        for words in ("memlib serve hash-token", "serve.admin_token_hash", "serve.tenant_token_hashes",
                      "memlib serve --store STORE --open-local"):
            assert words in hint, hint
        assert page.is_hidden("#ask") and page.is_hidden("#error")  # no error for not having a token yet
        page.screenshot(path=str(tmp_path / "explorer-landing.png"))
        if os.environ.get("MEMLIB_SCREENSHOTS"):
            shutil.copy(tmp_path / "explorer-landing.png", Path(os.environ["MEMLIB_SCREENSHOTS"]))


def test_explorer_page_in_headless_chromium(serve_url, full_store, tmp_path):
    turns = turns_of(full_store, "maya")
    shot = tmp_path / "explorer.png"
    with chromium_page() as (page, refused):  # refused: what the page's Content-Security-Policy blocked
        resp = page.goto(f"{serve_url}/ui/")
        assert "frame-ancestors 'none'" in resp.headers["content-security-policy"]
        page.fill("#token", SAMPLE_TOKENS["maya"])
        page.click("#connect button")
        page.wait_for_selector("#ask:not([hidden])", timeout=60_000)
        assert page.eval_on_selector_all("#tenant option", "os => os.map(o => o.value)") == ["maya"]
        page.fill("#question", QUESTION)
        page.click("#search")
        page.wait_for_selector("#results li.hit", timeout=60_000)
        hits = page.eval_on_selector_all("#results li.hit", "ls => ls.map(l => l.dataset.turn)")
        assert hits and all(h in turns for h in hits)
        assert any("coriander" in turns[h]["text"] for h in hits[:3])
        first = page.inner_text("#results li.hit >> nth=0")
        assert turns[hits[0]]["text"] in first and turns[hits[0]]["session_id"] in first and "2024-" in first
        chip = page.eval_on_selector("#results li.hit .chip.kind", "e => getComputedStyle(e).backgroundColor")
        assert chip not in ("", "rgba(0, 0, 0, 0)", "rgb(238, 241, 246)"), chip  # its kind's colour, not .chip's
        page.click("#results li.hit >> nth=0")
        page.wait_for_selector("#graph svg circle", timeout=60_000)
        assert turns[hits[0]]["text"] in page.inner_text("#session li.focus")
        assert page.locator("#graph svg circle").count() >= 2 and page.locator("#derived li").count() >= 1
        page.screenshot(path=str(shot), full_page=True)
        page.click("#compare")
        page.wait_for_selector("#comparison .col li", timeout=60_000)
        columns = page.eval_on_selector_all("#comparison .col", "cs => cs.map(c => c.dataset.strategy)")
        assert len(columns) >= 2 and "auto" in columns
        page.screenshot(path=str(tmp_path / "explorer-compare.png"), full_page=True)
        assert not refused, refused
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
