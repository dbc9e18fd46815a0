"""Embedder fixtures: one instance per local backend per test session (loading is slow)."""
from __future__ import annotations

import pytest

from memlib.embed import LOCAL_BACKENDS, config_for, get_embedder


@pytest.fixture(scope="session", params=[b.value for b in LOCAL_BACKENDS])
def local_embedder(request):
    cfg = config_for(request.param).model_copy(update={"batch_size": 4, "threads": 1})
    return get_embedder(cfg)
