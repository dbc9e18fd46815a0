"""A tiny hand-made store (two sessions, a fact node) with deterministic hashing vectors."""
from __future__ import annotations

import re
import zlib
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from memlib import ids
from memlib.io.store import StoreWriter

DIM = 64
TENANT = "conv-a"

TURNS = [  # session, turn id, speaker, text
    ("S1", "D1:1", "Ann", "I adopted a puppy named Biscuit last week"),
    ("S1", "D1:2", "Bob", "That is lovely, what breed is Biscuit?"),
    ("S1", "D1:3", "Ann", "A golden retriever, he loves the beach"),
    ("S2", "D2:1", "Bob", "I started learning the violin in March"),
    ("S2", "D2:2", "Ann", "My sister plays violin in an orchestra in Berlin"),
    ("S2", "D2:3", "Bob", "I want to visit Berlin next summer"),
]
SESSION_TIME = {"S1": datetime(2023, 5, 7, 13, 0, tzinfo=timezone.utc),
                "S2": datetime(2023, 6, 1, 9, 30, tzinfo=timezone.utc)}


class HashEmbedder:
    """Bag-of-words hashing vectors: deterministic, shares words -> positive cosine."""

    dim = DIM

    def _vec(self, text: str) -> np.ndarray:
        v = np.zeros(DIM, dtype=np.float32)
        for w in re.findall(r"[a-z0-9]+", text.lower()):
            v[zlib.crc32(w.encode()) % DIM] += 1.0
        n = np.linalg.norm(v)
        return v / n if n else v

    def embed_queries(self, texts):
        return np.stack([self._vec(t) for t in texts]) if texts else np.zeros((0, DIM), np.float32)

    embed_passages = embed_queries


def _turns_table() -> pa.Table:
    rows = []
    for i, (sess, tid, spk, text) in enumerate(TURNS):
        rows.append(dict(tenant_id=TENANT, conversation_id=TENANT, session_id=sess,
                         session_index=int(sess[1:]), session_time=SESSION_TIME[sess], turn_id=tid,
                         turn_index=i, node_id=ids.turn_node_id(TENANT, TENANT, tid), speaker=spk,
                         role="user", text=f"{spk}: {text}", content_hash=ids.content_hash(text), extras=None))
    return pa.Table.from_pylist(rows)


def _nodes_table(turns: pa.Table, emb: HashEmbedder) -> pa.Table:
    t = turns.to_pylist()
    rows = [dict(node_id=r["node_id"], tenant_id=TENANT, conversation_id=TENANT, kind="turn", text=r["text"],
                 time=r["session_time"], session_id=r["session_id"], provenance=[r["node_id"]]) for r in t]
    fact_text = "Ann's sister lives in Berlin and plays violin"
    rows.append(dict(node_id=ids.make_id("fact", TENANT, fact_text), tenant_id=TENANT, conversation_id=TENANT,
                     kind="fact", text=fact_text, time=SESSION_TIME["S2"], session_id="S2",
                     provenance=[t[4]["node_id"], t[5]["node_id"]]))
    vecs = emb.embed_passages([r["text"] for r in rows])
    for r, v in zip(rows, vecs):
        r["embedding"] = v.tolist()
    return pa.Table.from_pylist(rows)


def _questions_table() -> pa.Table:
    return pa.Table.from_pylist([
        dict(tenant_id=TENANT, question_id="q1", question="What breed is Ann's puppy Biscuit?",
             answer="golden retriever", category="1", evidence=["D1:1", "D1:3"], evidence_sessions=["S1"]),
        dict(tenant_id=TENANT, question_id="q2", question="Where does Ann's sister play violin?",
             answer="Berlin", category="4", evidence=["D2:2"], evidence_sessions=["S2"]),
        dict(tenant_id=TENANT, question_id="q3", question="What instrument did Bob start learning?",
             answer="violin", category="5", evidence=["D2:1"], evidence_sessions=["S2"]),
        dict(tenant_id=TENANT, question_id="q4", question="Who went to Paris?",
             answer="nobody", category="2", evidence=["D9:99"], evidence_sessions=[]),
    ])


@pytest.fixture(scope="session")
def hash_embedder() -> HashEmbedder:
    return HashEmbedder()


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory, hash_embedder) -> Path:
    path = tmp_path_factory.mktemp("store")
    w = StoreWriter(path, dim=DIM)
    turns = _turns_table()
    w.write_table("turns", TENANT, turns)
    w.write_table("questions", TENANT, _questions_table())
    w.replace_tenant_nodes([TENANT], _nodes_table(turns, hash_embedder))
    w.index_nodes()
    w.publish({"tenants": {TENANT: {"turns": turns.num_rows}}})
    return path
