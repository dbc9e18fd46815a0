"""The build on a Ray cluster of 1 head + 2 worker nodes on this machine (ray.cluster_utils.Cluster):
work lands on more than one node and the output equals the single-node build."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs.conftest import ALL, node_rows, write_jsonl

pytestmark = pytest.mark.ray


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_args(**kw) -> dict:
    """Per-node agent ports picked free (another Ray on this machine may hold the defaults)."""
    return {"num_cpus": 1, "dashboard_agent_listen_port": _free_port(), "runtime_env_agent_port": _free_port(),
            "metrics_export_port": _free_port(), **kw}


def test_jobs_multinode_build_matches_single_node(base_store, tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args=_node_args(include_dashboard=False))
    try:
        for _ in range(2):
            cluster.add_node(**_node_args())
        cluster.wait_for_nodes()
        inp = write_jsonl(tmp_path / "in.jsonl", ALL)
        store = tmp_path / "store"
        # one tenant actor per turn to build and each tenant in a row of its own (the defaults size the
        # pool by work and let small tenants travel together: this tiny input gets one actor and one row)
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1",
               "MEMLIB__RAY__TENANT_ACTOR_TURNS": "1", "MEMLIB__RAY__TENANT_BATCH_TURNS": "1"}
        env.pop("RAY_ADDRESS", None)
        res = subprocess.run([sys.executable, "-m", "jobs.nightly", "--input", str(inp), "--format", "jsonl",
                              "--out", str(store), "--address", cluster.address, "--num-cpus", "3"],
                             env=env, capture_output=True, text=True, timeout=1200,
                             cwd=Path(__file__).resolve().parents[2])
        assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    finally:
        cluster.shutdown()
    m = json.loads((store / "manifest.json").read_text())
    nodes = set(m["tenant_nodes"].values())
    assert len(nodes) >= 2, m["tenant_nodes"]
    assert node_rows(store) == node_rows(base_store[1])
