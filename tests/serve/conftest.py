"""Serve fixtures: a two-tenant store written directly with StoreWriter (hashing vectors,
no Ray) for the in-process app tests, and tokens with their config digests; the sample
conversations built into a full store by `memlib build`; an MCP client helper (the SDK's)."""
from __future__ import annotations

import re
import zlib
from datetime import datetime, timezone
from pathlib import Path

import anyio
import httpx2
import numpy as np
import pyarrow as pa
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from memlib import ids
from memlib.config import MemlibConfig
from memlib.io.store import StoreWriter
from memlib.serve.auth import hash_token

DIM = 32
TOKENS = {"alice": "tok-alice-0001", "bob": "tok-bob-0002"}
ADMIN = "tok-admin-0003"
CONVERSATIONS = {
    "alice": [("s1", "a:1", "I went hiking in the Alps with my brother in June"),
              ("s1", "a:2", "My favourite food is mushroom risotto"),
              ("s2", "a:3", "Next month I start a pottery class on Tuesdays")],
    "bob": [("s1", "b:1", "I bought a red bicycle for commuting"),
            ("s1", "b:2", "My cat Pixel hates the vacuum cleaner")],
}


class HashEmbedder:
    """Deterministic bag-of-words hashing vectors."""

    def _vec(self, text: str) -> np.ndarray:
        v = np.zeros(DIM, dtype=np.float32)
        for w in re.findall(r"[a-z0-9]+", text.lower()):
            v[zlib.crc32(w.encode()) % DIM] += 1.0
        return v / max(float(np.linalg.norm(v)), 1e-12)

    def embed_queries(self, texts):
        return np.stack([self._vec(t) for t in texts]) if len(texts) else np.zeros((0, DIM), np.float32)


def _tables(tenant: str, emb: HashEmbedder, suffix: str = "") -> tuple[pa.Table, pa.Table]:
    t0 = datetime(2024, 1, 9, 19, 0, tzinfo=timezone.utc)
    turns, nodes = [], []
    for i, (sess, tid, text) in enumerate(CONVERSATIONS[tenant]):
        text = text + suffix
        nid = ids.turn_node_id(tenant, tenant, tid)
        turns.append(dict(tenant_id=tenant, conversation_id=tenant, session_id=sess, session_index=int(sess[1:]),
                          session_time=t0, turn_id=tid, turn_index=i, node_id=nid, speaker=tenant, role="user",
                          text=text, content_hash=ids.content_hash(text), extras=None))
        nodes.append(dict(node_id=nid, tenant_id=tenant, conversation_id=tenant, kind="turn", text=text, time=t0,
                          session_id=sess, provenance=[nid], embedding=emb._vec(text).tolist()))
    return pa.Table.from_pylist(turns), pa.Table.from_pylist(nodes)


def write_version(path: Path, emb: HashEmbedder, suffix: str = "") -> str:
    """Publish a (new) version of the two-tenant store; returns its version name."""
    w = StoreWriter(path, dim=DIM)
    all_nodes = []
    for tenant in CONVERSATIONS:
        turns, nodes = _tables(tenant, emb, suffix)
        w.write_table("turns", tenant, turns)
        w.write_table("questions", tenant, pa.Table.from_pylist([dict(
            tenant_id=tenant, question_id=f"{tenant}-q1", question=f"What did {tenant} say about {suffix or 'it'}?",
            answer="", category="1", evidence=[turns.column("turn_id")[0].as_py()], evidence_sessions=["s1"])]))
        all_nodes.append(nodes)
    w.replace_tenant_nodes(list(CONVERSATIONS), pa.concat_tables(all_nodes))
    w.index_nodes()
    return w.publish({"tenants": {t: {} for t in CONVERSATIONS}})["version"]


@pytest.fixture(scope="session")
def embedder() -> HashEmbedder:
    return HashEmbedder()


@pytest.fixture()
def store(tmp_path, embedder) -> Path:
    write_version(tmp_path / "store", embedder)
    return tmp_path / "store"


def serve_config(**serve) -> MemlibConfig:
    cfg = MemlibConfig()
    cfg.serve.tenant_token_hashes = {t: hash_token(tok) for t, tok in TOKENS.items()}
    cfg.serve.admin_token_hash = hash_token(ADMIN)
    cfg.serve.poll_interval_s = 0.0
    cfg.retrieve.default_strategy = "bm25"
    for key, value in serve.items():
        setattr(cfg.serve, key, value)
    return cfg


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


SAMPLE = Path(__file__).resolve().parents[2] / "memlib" / "data" / "sample_conversations.jsonl"
# tokens of the sample store's tenants (maya, raj) and the admin
SAMPLE_TOKENS = {"maya": TOKENS["alice"], "raj": TOKENS["bob"]}


def build_sample(out: Path, *args: str) -> Path:
    """``memlib build`` of the bundled sample conversations into ``out``, in a subprocess."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "build", "-i", str(SAMPLE), "-f", "jsonl", "-o", str(out),
                           "--num-cpus", "2", *args], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def full_store(tmp_path_factory) -> Path:
    """The bundled sample conversations built by `memlib build` with the default (full) recipe and
    embedder: facts, triplets, entities, events and their edges, as a real store has them."""
    return build_sample(tmp_path_factory.mktemp("full_store") / "store")


@pytest.fixture()
def service(store, embedder):
    """A started in-process :class:`SearchService` over the synthetic ``store``."""
    from memlib.serve.service import SearchService

    svc = SearchService(store, serve_config(), embedder=embedder).start()
    yield svc
    svc.stop()


def sample_serve_config(**serve) -> MemlibConfig:
    """Tokens of the sample store's tenants, the default embedder (the one the store was built with)."""
    cfg = serve_config(**serve)
    cfg.serve.tenant_token_hashes = {t: hash_token(tok) for t, tok in SAMPLE_TOKENS.items()}
    return cfg


def mcp_errors(exc: BaseException) -> list[MCPError]:
    if isinstance(exc, MCPError):
        return [exc]
    if isinstance(exc, BaseExceptionGroup):
        return [e for sub in exc.exceptions for e in mcp_errors(sub)]
    return []


def mcp_call(url: str, token: str | None, calls, mode: str = "auto"):
    """Open an SDK client on ``url``/mcp and run ``calls(client)`` (an async function). An
    MCPError arrives wrapped in the client's task groups; it is raised alone."""
    async def run():
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx2.AsyncClient(headers=headers) as http:
            async with Client(streamable_http_client(f"{url}/mcp", http_client=http), mode=mode) as client:
                return await calls(client)

    try:
        return anyio.run(run)
    except BaseExceptionGroup as group:
        errors = mcp_errors(group)
        if len(errors) == 1:
            raise errors[0] from None
        raise
