"""Fixtures for the text stages: small hand-written TURNS tables and synthetic vectors."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pytest

from memlib import ids, schema

# (tenant, conversation, session, session_index, speaker, text, extras)
CHAT = [
    ("t1", "c1", "S1", 0, "Ana", "Hey Ben! Good to see you!", None),
    ("t1", "c1", "S1", 0, "Ben", "Hi Ana! Thanks!", None),
    ("t1", "c1", "S1", 0, "Ana", "I adopted a rescue dog named Biscuit last week. He is a beagle.", None),
    ("t1", "c1", "S1", 0, "Ben", "haha", None),
    ("t1", "c1", "S1", 0, "Ana", "My goal is to run the Boston marathon in April 2024.", None),
    ("t1", "c1", "S1", 0, "Ben", "I started a pottery class at the community center.",
     {"blip_caption": "a photo of a clay bowl on a wheel"}),
    ("t1", "c1", "S1", 0, "Ana", "Thanks!", None),
    ("t1", "c1", "S1", 0, "Ben", "Bye, take care", None),
    ("t1", "c1", "S2", 1, "Ana", "I moved to Denver for a new job at a bakery.", None),
    ("t1", "c1", "S2", 1, "Ben", "Wow, that's cool!", None),
    ("t1", "c1", "S2", 1, "Ana", "I love baking sourdough bread every morning.", None),
    ("t2", "c9", "S1", 0, "Zed", "We bought a sailboat in Maine.", None),
    ("t2", "c9", "S1", 0, "Yan", "Good to see you!", None),
    ("t2", "c9", "S1", 0, "Zed", "My daughter turns 7 on June 3.", None),
]


def make_turns(rows=CHAT, times=None) -> pa.Table:
    """A TURNS table from ``(tenant, conv, session, session_index, speaker, text, extras)`` rows."""
    cols: dict[str, list] = {f.name: [] for f in schema.TURNS}
    counters: dict[tuple, int] = {}
    for tenant, conv, sess, sidx, speaker, text, extras in rows:
        key = (tenant, conv, sess)
        tidx = counters.get(key, 0)
        counters[key] = tidx + 1
        turn_id = f"{sess}:{tidx + 1}"
        cols["tenant_id"].append(tenant)
        cols["conversation_id"].append(conv)
        cols["session_id"].append(sess)
        cols["session_index"].append(sidx)
        cols["session_time"].append((times or {}).get(sess, datetime(2023, 5, 8 + sidx, 13, 0, tzinfo=timezone.utc)))
        cols["turn_id"].append(turn_id)
        cols["turn_index"].append(tidx)
        cols["node_id"].append(ids.turn_node_id(tenant, conv, turn_id))
        cols["speaker"].append(speaker)
        cols["role"].append("user" if speaker in ("Ana", "Zed") else "other")
        cols["text"].append(text)
        cols["content_hash"].append(ids.content_hash(text))
        cols["extras"].append(json.dumps(extras) if extras else None)
    return pa.Table.from_pydict(cols, schema=schema.TURNS)


def topic_vectors(topics: list[int], dim: int = 32, noise: float = 0.05, seed: int = 0) -> np.ndarray:
    """L2-normalized float32 vectors: one random direction per topic id, plus small noise."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(max(topics) + 1, dim))
    v = centers[np.asarray(topics)] + noise * rng.normal(size=(len(topics), dim))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture
def turns() -> pa.Table:
    return make_turns()
