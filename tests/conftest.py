"""Shared test fixtures. Area-specific fixtures live in tests/<area>/conftest.py."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("MEMLIB_SHARED_DATA", REPO.parent / "shared" / "data"))

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# the suite's builds run on Ray, whatever their size and whether this process has joined a Ray
# already; tests/jobs/test_jobs_inline.py builds small incremental runs in-process on purpose
os.environ.setdefault("MEMLIB__RAY__INLINE_MAX_TURNS", "0")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (LoCoMo dev3, LongMemEval samples); skipped where it is absent."""
    if not (SHARED_DATA / "MANIFEST.json").exists():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def locomo_path(shared_data: Path) -> Path:
    return shared_data / "locomo_dev3.json"


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray instance (2 CPUs, no dashboard) for every test marked ``ray``."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


# fixtures that start a Ray cluster, in this process or in a `memlib build` child: a test using
# one is marked ``ray`` whatever its module says, so `make test-fast` (-m "not ray") never starts Ray
RAY_FIXTURES = frozenset({"ray_local", "sample_store", "full_store", "base_store", "built_store"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if RAY_FIXTURES & set(getattr(item, "fixturenames", ())) and "ray" not in item.keywords:
            item.add_marker(pytest.mark.ray)
