"""Shared test fixtures. Area-specific fixtures live in tests/<area>/conftest.py."""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet request handler answering JSON: the base of the tests' fake OpenAI-compatible servers."""

    def log_message(self, *args):
        pass

    def send_json(self, code: int, obj: dict) -> None:
        raw = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` on a threaded server at a free loopback port for the block; yields its ``/v1`` URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


# a test using one of these fixtures carries the marker whatever its module says, so `make test-fast`
# (-m "not ray and not heavy") never starts Ray nor waits for what they make: ``ray`` fixtures start a
# Ray cluster, in this process or in a `memlib build` child; ``heavy`` ones build a tenant in process
FIXTURE_MARKS = {
    "ray": frozenset({"ray_local", "sample_store", "full_store", "base_store", "built_store"}),
    "heavy": frozenset({"tenant_pass"}),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for mark, fixtures in FIXTURE_MARKS.items():
            if fixtures & used and mark not in item.keywords:
                item.add_marker(getattr(pytest.mark, mark))
