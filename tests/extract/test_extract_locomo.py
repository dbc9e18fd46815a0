import time

import polars as pl
import pytest

from memlib import schema
from memlib.compose.steps import run_extractions
from memlib.config import MemlibConfig
from memlib.extract.base import ExtractionContext


@pytest.mark.slow
def test_locomo_dev3_smoke(locomo_path):
    readers = pytest.importorskip("memlib.io.readers")
    cfg = MemlibConfig()
    turns = readers.read_input(locomo_path, "locomo", cfg.io).turns
    start = time.perf_counter()
    res = run_extractions(ExtractionContext(turns=turns, config=cfg))
    elapsed = time.perf_counter() - start
    schema.check(res.nodes, schema.NODES_NO_EMBEDDING)
    kinds = dict(pl.from_arrow(res.nodes).group_by("kind").len().rows())
    assert kinds["fact"] > turns.num_rows and kinds["concept"] > 100 and kinds["reflection"] > 0
    concepts = pl.from_arrow(res.nodes).filter(pl.col("kind") == "concept")["text"]
    speakers = {s.lower() for s in turns.column("speaker").to_pylist() if s}
    assert not any(set(c.split()) & speakers for c in concepts)
    assert elapsed < 120, elapsed
