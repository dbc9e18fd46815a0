"""Ray's own cost for a build (``memlib bench build --ray-overhead``): the build's operator graph
and the smallest actor-pool pipeline, each run empty on a fresh local Ray in a fresh process."""
from __future__ import annotations

import pytest

from jobs.bench.ray_overhead import floor_ratio_bound, ray_overhead
from memlib.config import MemlibConfig
from pipelines.staged_build import resources


def test_the_bound_spreads_every_cpu_second_over_the_cores():
    # 24 CPU-s of Ray, 36 CPU-s of encoder and spaCy, 2 cores, a 10 s floor: 30 s at best, 3 floors
    assert floor_ratio_bound(24.0, 36.0, 2, 10.0) == pytest.approx(3.0)
    assert floor_ratio_bound(0.0, 20.0, 2, 10.0) == pytest.approx(1.0)  # only the floor's own work
    assert floor_ratio_bound(10.0, 10.0, 0, 10.0) == pytest.approx(2.0)  # no core count: one core


@pytest.mark.ray
def test_the_empty_build_graph_has_the_builds_actors_and_costs_cpu():
    cfg = MemlibConfig()
    res = resources(cfg, 2, 6, 3, 1451)
    out = ray_overhead(cfg, 2, blocks=6, tenants=3, turns=1451)
    assert out["rows"] == 9
    assert out["actors"] == res.embed_actors + res.session_actors + res.tenant_actors
    for name in ("graph", "minimal"):
        # Ray's start and its worker processes are real work: a second at the very least, and the
        # pipeline ends after Ray is up
        assert out[f"{name}_cpu_s"] > 1.0
        assert 0 < out[f"{name}_ray_up_s"] < out[f"{name}_wall_s"]
