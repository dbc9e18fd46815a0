"""The staged Ray pipeline (2 CPUs, 3 tenants, small session blocks: a tenant split over two
blocks, a block holding two tenants) produces what process_tenant produces in one process."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from memlib.compose import process_tenant
from memlib.compose.vectors import TurnEncoder
from memlib.config import MemlibConfig
from memlib.io.store import StoreReader
from tests.pipeline.conftest import SESSIONS

pytestmark = pytest.mark.ray

COLS = ["node_id", "tenant_id", "kind", "text", "time", "session_id", "provenance", "attributes"]


def _vectors(table) -> np.ndarray:
    emb = table.column("embedding").combine_chunks()
    return emb.values.to_numpy(zero_copy_only=False).reshape(-1, emb.type.list_size)


def test_ray_output_equals_single_process(built_store):
    reader = StoreReader(built_store)
    assert len(reader.tenants()) >= 3
    pids = {reader.manifest["tenants"][t]["turns"] for t in reader.tenants()}
    assert pids  # every tenant was built
    sessions = reader.manifest["sessions"]
    assert sessions["blocks"] >= 3 and sessions["sessions_computed"] == sessions["sessions"] == 5
    cfg = MemlibConfig()
    encoder = TurnEncoder(cfg)
    for tenant in SESSIONS:
        turns = reader.table("turns", tenant)
        local = process_tenant(turns, cfg, encoder)
        ray_nodes = reader.nodes(tenant=tenant).sort_by("node_id")
        local_nodes = local.nodes.sort_by("node_id")
        assert pl.from_arrow(ray_nodes.select(COLS)).equals(pl.from_arrow(local_nodes.select(COLS))), tenant
        # every text is encoded on its own (memlib.compose.vectors.one_by_one): its vectors do not
        # depend on the block, batch or thread count it was encoded with
        np.testing.assert_array_equal(_vectors(ray_nodes), _vectors(local_nodes))
        keys = ["src", "dst", "kind", "relation"]
        ray_edges = pl.from_arrow(reader.edges(tenant)).select(keys).sort(keys)
        local_edges = pl.from_arrow(local.edges).select(keys).sort(keys)
        assert ray_edges.equals(local_edges), tenant
        segs = pl.from_arrow(reader.table("segments", tenant)).sort("segment_id")
        assert segs.equals(pl.from_arrow(local.segments).sort("segment_id")), tenant


def test_embed_and_session_local_apart_build_the_same_store(built_store, ray_local, tiny_input, tmp_path, monkeypatch):
    """Few blocks run the embed and session-local stages in one actor (SessionPassOp); many keep
    them in two. Forced apart on the same input, the build publishes the same rows."""
    import pipelines.staged_build as staged
    from tests.pipeline.conftest import BLOCK_TURNS, run_cli

    monkeypatch.setattr(staged, "FEW_BLOCKS_PER_ACTOR", 0)
    out = tmp_path / "apart"
    res = run_cli(["build", "--input", str(tiny_input), "--format", "jsonl", "--out", str(out), "--num-cpus", "2",
                   "--set", f"ray.block_turns={BLOCK_TURNS}"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    fused, apart = StoreReader(built_store), StoreReader(out)
    assert fused.manifest["sessions"]["one_session_actor"] is True
    assert apart.manifest["sessions"]["one_session_actor"] is False
    cols = [*COLS, "importance"]
    a, b = fused.nodes().sort_by("node_id"), apart.nodes().sort_by("node_id")
    assert pl.from_arrow(a.select(cols)).equals(pl.from_arrow(b.select(cols)))
    np.testing.assert_array_equal(_vectors(a), _vectors(b))
    keys = ["src", "dst", "kind", "relation", "weight"]
    assert pl.from_arrow(fused.edges()).select(keys).sort(keys[:4]).equals(
        pl.from_arrow(apart.edges()).select(keys).sort(keys[:4]))
