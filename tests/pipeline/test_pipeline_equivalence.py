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
