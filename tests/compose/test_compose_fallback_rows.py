"""fallbacks_table taking the published rows (Fallback.row) equals making every row from its views."""
import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from memlib import schema
from memlib.compose.fallback_rows import fallbacks_table
from memlib.compose.published_parts import PublishedParts
from memlib.compose.span_pool import Fallback


def _nodes(n: int) -> pa.Table:
    kinds = ["clue" if i % 5 == 0 else "fact" for i in range(n)]
    return pa.table({"tenant_id": ["t"] * n, "node_id": [f"n{i % (n - 3)}" for i in range(n)], "kind": kinds,
                     "text": [f"text {i}" for i in range(n)], "provenance": [[f"turn{i % 7}"] for i in range(n)]})


def _fallback(rng: np.random.Generator, with_local: bool) -> Fallback:
    k = int(rng.integers(0, 5))
    ids = np.sort(rng.choice(1000, k, replace=False)).astype(np.int32)
    local = rng.standard_normal(8).astype(np.float32) if with_local else None
    return Fallback(ids, rng.integers(1, 4, k).astype(np.int32), local)


def _published(rng: np.random.Generator, n: int) -> PublishedParts:
    made = {i: _fallback(rng, i % 4 != 0) for i in range(n)}
    table = fallbacks_table(_nodes(n), made)
    buf = io.BytesIO()  # read back as a store reads it (Parquet's list field names, two row groups)
    pq.write_table(table, buf, row_group_size=n // 2)
    return PublishedParts.of(schema.empty(schema.EDGES), pq.read_table(io.BytesIO(buf.getvalue())))


def test_taken_rows_equal_made_rows():
    rng = np.random.default_rng(7)
    parts = _published(rng, 40)
    known = list(parts.fallbacks.values())
    assert all(f.row >= 0 for f in known) and parts.fallback_rows is not None
    order = rng.permutation(len(known))
    fallbacks = {}  # node row -> a published Fallback in another order, or one made here
    for r in range(60):
        fallbacks[r] = known[order[r]] if r < len(known) and r % 6 else _fallback(rng, r % 3 != 0)
    nodes = _nodes(60)
    taken = fallbacks_table(nodes, fallbacks, parts.fallback_rows)
    made = fallbacks_table(nodes, {r: Fallback(f.ids, f.counts, f.local) for r, f in fallbacks.items()})
    assert taken.equals(made)
    assert taken.schema.equals(schema.NODE_FALLBACKS)
    assert taken.column("local").null_count > 0 and taken.num_rows < len(fallbacks)  # nulls and one row per id


def test_no_published_rows_made_whole():
    rng = np.random.default_rng(3)
    parts = _published(rng, 10)
    fallbacks = {r: _fallback(rng, True) for r in range(12)}
    nodes = _nodes(12)
    assert fallbacks_table(nodes, fallbacks, parts.fallback_rows).equals(fallbacks_table(nodes, fallbacks))
