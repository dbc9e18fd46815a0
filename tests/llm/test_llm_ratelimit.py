"""The shared rate limiter holds the configured requests/minute across 2 Ray workers."""
import time

import pytest

from tests.llm.conftest import llm_config

VARS = {"turns": "[0] A: I adopted a puppy named Rex last Sunday in Boston.", "session_date": "2023-01-01"}


@pytest.mark.ray
def test_rpm_holds_across_two_workers(ray_local, fake_server):
    from pipelines.llm_actors import shared_limiter

    ray = ray_local
    srv = fake_server()
    cfg = llm_config(srv.url, requests_per_minute=120, tokens_per_minute=10_000_000)
    limiter = shared_limiter(cfg, name="test-rpm-limiter")

    @ray.remote(num_cpus=0.5)
    def worker(cfg, limiter, seconds, tag):
        from memlib.llm.client import LLMClient
        from memlib.llm.models import Task
        client = LLMClient(cfg.llm, limiter=limiter)
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            client.call(Task.TRIPLETS, dict(VARS, session_date=f"{tag}-{n}"), unit_id=f"{tag}{n}")
            n += 1
        return n

    seconds = 4.0
    counts = ray.get([worker.remote(cfg, limiter, seconds, t) for t in ("a", "b")])
    times = sorted(srv.state.times)
    assert all(c >= 2 for c in counts)  # both workers got slots
    assert len(times) == sum(counts)
    # 120 rpm = one request per 0.5 s; arrival jitter (first connection) may pull two closer,
    # but no 2-second window holds more than 4 + 1 requests
    assert max(sum(1 for t in times if a <= t < a + 2.0) for a in times) <= 5
    span = times[-1] - times[0]
    assert (len(times) - 1) / span * 60 <= 120 * 1.1


@pytest.mark.ray
def test_each_run_gets_a_live_limiter(ray_local, fake_server):
    """A build drops its limiter when it ends; the next build in the same Ray session must not
    be handed that dying actor (it was found by name: ActorDiedError in every tenant)."""
    import gc

    from pipelines.llm_actors import shared_limiter

    cfg = llm_config(fake_server().url, requests_per_minute=100_000, tokens_per_minute=10_000_000)
    first, second = shared_limiter(cfg), shared_limiter(cfg)
    assert first.handle._actor_id != second.handle._actor_id  # each run owns its limiter
    del first, second
    for _ in range(8):
        limiter = shared_limiter(cfg)
        assert limiter.reserve(1) >= 0.0
        del limiter
        gc.collect()
