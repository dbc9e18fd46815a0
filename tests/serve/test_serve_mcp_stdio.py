"""`memlib mcp --store STORE [--tenant T]`: the MCP server over stdio as a subprocess, driven by the
official SDK's stdio client over a store built by `memlib build`."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

from memlib.io.store import StoreReader

REPO = Path(__file__).resolve().parents[2]


def stdio_session(store: Path, calls, *extra: str):
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "jobs.cli", "mcp", "--store", str(store), *extra],
                                   env={"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"},
                                   cwd=str(REPO))

    async def run():
        async with Client(params, read_timeout_seconds=300) as client:
            return await calls(client)

    return anyio.run(run)


def store_turns(store: Path, tenant: str) -> dict[str, dict]:
    cols = ["turn_id", "session_id", "session_time", "turn_index", "speaker", "text"]
    return {r["turn_id"]: r for r in StoreReader(store).table("turns", tenant, columns=cols).to_pylist()}


def test_stdio_bound_to_one_tenant(full_store):
    async def calls(c):
        tools = await c.list_tools()
        hit = await c.call_tool("search_memory", {"query": "does Maya eat coriander?", "k": 5})
        top = hit.structured_content["turns"][0]
        session = await c.call_tool("get_session", {"session_id": top["session_id"], "around": top["turn_id"],
                                                    "window": 2})
        return (tools, hit, session, await c.call_tool("list_tenants", {}),
                await c.call_tool("search_memory", {"query": "rate limiter interview", "tenant": "raj"}))

    tools, hit, session, tenants, other = stdio_session(full_store, calls, "--tenant", "maya")
    assert {t.name for t in tools.tools} == {"search_memory", "list_tenants", "get_session"}
    assert not hit.is_error and hit.structured_content["tenant"] == "maya"
    turns = store_turns(full_store, "maya")
    for t in hit.structured_content["turns"]:  # every hit is a real turn of the store, with its session and time
        real = turns[t["turn_id"]]
        assert (t["text"], t["session_id"], t["speaker"]) == (real["text"], real["session_id"], real["speaker"])
        assert t["time"] == real["session_time"].isoformat()
    assert any("coriander" in t["text"] for t in hit.structured_content["turns"])
    assert "coriander" in hit.content[0].text and "2024-01-09" in hit.content[0].text
    top = hit.structured_content["turns"][0]
    same_session = sorted((r for r in turns.values() if r["session_id"] == top["session_id"]),
                          key=lambda r: r["turn_index"])
    pos = [r["turn_id"] for r in same_session].index(top["turn_id"])
    expected = [r["turn_id"] for r in same_session[max(0, pos - 2):pos + 3]]
    assert [t["turn_id"] for t in session.structured_content["turns"]] == expected
    assert tenants.structured_content["tenants"] == ["maya"]
    assert other.is_error and other.content[0].text.startswith("forbidden:")


def test_stdio_without_tenant_reaches_every_tenant(full_store):
    async def calls(c):
        return (await c.call_tool("list_tenants", {}),
                await c.call_tool("search_memory", {"query": "rate limiter interview", "tenant": "raj",
                                                    "strategy": "bm25"}),
                await c.call_tool("search_memory", {"query": "rate limiter"}))

    tenants, raj, unnamed = stdio_session(full_store, calls)
    assert tenants.structured_content["tenants"] == ["elena", "maya", "raj", "tomas-lena"]
    assert not raj.is_error and raj.structured_content["turns"]
    assert set(t["turn_id"] for t in raj.structured_content["turns"]) <= set(store_turns(full_store, "raj"))
    assert unnamed.is_error and "tenant" in unnamed.content[0].text


def test_mcp_command_rejects_a_bad_store_or_tenant(full_store, tmp_path):
    run = [sys.executable, "-m", "jobs.cli", "mcp", "--store"]
    proc = subprocess.run(run + [str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and "not a memlib store" in proc.stderr
    proc = subprocess.run(run + [str(full_store), "--tenant", "nobody"], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 2 and "'nobody' is not in store" in proc.stderr and "maya" in proc.stderr


def test_stdio_answers_unreadable_lines_and_names_no_token(full_store):
    """Before: a line that is not JSON got no answer at all (the client waited), and a tenant
    outside `--tenant` was refused with "this token may not query", where no token exists."""
    import json

    proc = subprocess.Popen([sys.executable, "-m", "jobs.cli", "mcp", "--store", str(full_store), "--tenant", "maya"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=REPO, env={"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    try:
        answers = []
        for line in ('{"jsonrpc": "2.0", "id": 1, "method": "tools/list"\n', '{"hello": "world"}\n'):
            proc.stdin.write(line)
            proc.stdin.flush()
            answers.append(json.loads(proc.stdout.readline()))
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    assert [a["error"]["code"] for a in answers] == [-32700, -32600], answers
    assert all(a["id"] is None and a["jsonrpc"] == "2.0" for a in answers)

    async def calls(c):
        return await c.call_tool("search_memory", {"query": "rate limiter interview", "tenant": "raj"})

    other = stdio_session(full_store, calls, "--tenant", "maya")
    text = other.content[0].text
    assert other.is_error and "bound to tenant 'maya'" in text and "token" not in text, text
