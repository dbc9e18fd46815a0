"""A fact's vector with the default embedder: its span-pooled vector plus the vector of its own
text, normalized (memlib.compose.vectors.BLEND_KINDS); the own vector drafted and kept per
session, so the tenant stage encodes nothing and a nightly run only new sessions' facts."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from memlib import schema
from memlib.compose.steps import blend_own
from memlib.compose.vectors import TurnEncoder
from memlib.config import MemlibConfig
from memlib.io.store import StoreReader


class CountingEncoder:
    """Own vectors of texts as fixed unit vectors, counting what it was asked to encode."""
    kinds = ("fact",)
    blend = True

    def __init__(self, table: dict[str, np.ndarray]):
        self.table, self.asked = table, []

    def __call__(self, texts):
        self.asked += list(texts)
        return np.stack([self.table[t] for t in texts])


def _unit(v):
    v = np.asarray(v, dtype=np.float32)
    return v / np.linalg.norm(v)


def test_blend_sums_pooled_and_own_vectors_and_encodes_only_what_no_session_kept():
    nodes = pa.table({"node_id": ["t1", "f1", "f2", "f3", "c1"], "kind": ["turn", "fact", "fact", "fact", "concept"],
                      "text": ["a turn", "kept fact", "new fact", "copied fact", "concept"]})
    pooled = np.stack([_unit([1, 0, 0]), _unit([1, 1, 0]), _unit([0, 1, 0]), _unit([0, 0, 1]), _unit([1, 0, 1])])
    vectors = pooled.copy()
    kept = pa.table({"node_id": ["f1"], "vector": pa.array([[0.0, 0.0, 1.0]], pa.list_(pa.float32()))},
                    schema=schema.FACT_VECTORS)
    enc = CountingEncoder({"new fact": _unit([1, 0, 0])})
    encoded = blend_own(nodes, vectors, enc, np.array([3]), kept)
    assert encoded == 1 and enc.asked == ["new fact"]  # f1 kept by its session, f3 copied whole
    np.testing.assert_allclose(vectors[1], _unit(pooled[1] + np.array([0, 0, 1])), atol=1e-6)
    np.testing.assert_allclose(vectors[2], _unit(pooled[2] + np.array([1, 0, 0])), atol=1e-6)
    for row in (0, 3, 4):  # a turn, a copied fact and another kind keep their vectors
        np.testing.assert_array_equal(vectors[row], pooled[row])


def test_the_sessions_keep_each_fact_drafts_own_vector_and_the_tenant_stage_encodes_none(built_store: Path):
    from memlib.compose.block_files import read_table as _read_table

    manifest = json.loads((built_store / "manifest.json").read_text())
    kept = [_read_table(p) for p in sorted((built_store / "cache").rglob("fact_vectors.arrow"))]
    drafts = [_read_table(p) for p in sorted((built_store / "cache").rglob("fact_drafts.arrow"))]
    kept, drafts = pa.concat_tables(kept), pa.concat_tables(drafts)
    assert kept.num_rows == drafts.num_rows > 0
    assert sorted(kept.column("node_id").to_pylist()) == sorted(drafts.column("node_id").to_pylist())
    text = dict(zip(drafts.column("node_id").to_pylist(), drafts.column("text").to_pylist()))
    ids = kept.column("node_id").to_pylist()
    own = TurnEncoder(MemlibConfig(), threads=1).encode(ids, [text[i] for i in ids]).vectors
    got = np.stack([np.asarray(v, dtype=np.float32) for v in kept.column("vector").to_pylist()])
    np.testing.assert_allclose(got, own, atol=1e-6)  # each text alone: the same vector wherever encoded
    assert all(t.get("own_encoded") == 0 for t in manifest["tenants"].values())
    # every fact node of the store has its session's own vector in its stored one: not the own
    # vector alone, and nearer to it than a random direction would be
    reader = StoreReader(built_store)
    by_id = dict(zip(ids, got))
    for tenant in reader.tenants():
        nodes = reader.nodes(tenant, columns=["node_id", "kind", "embedding"])
        for nid, kind, emb in zip(*(nodes.column(c).to_pylist() for c in ("node_id", "kind", "embedding"))):
            if kind == "fact":
                cos = float(np.dot(emb, by_id[nid]))
                assert 0.7 < cos < 0.9999, (nid, cos)  # sqrt((1 + c) / 2) for the two parts' cosine c
