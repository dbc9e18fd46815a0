"""How many bytes a loaded tenant holds: the estimate that bounds the serving cache by bytes."""
from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from memlib.io.store import StoreReader

SAMPLE_ITEMS = 16  # a container of more items is measured by this many of them, evenly spaced


def approx_bytes(obj: Any, _seen: set[int] | None = None) -> int:
    """Bytes ``obj`` holds in memory, roughly: arrays and Arrow data by their buffers, containers
    by their items (a container of more than :data:`SAMPLE_ITEMS` items by a sample of them,
    scaled: walking every string of a LoCoMo tenant's columns took 38 ms, most of a cold query),
    memlib's own objects by their attributes, any other object by its own size (each object
    counted once; a tenant view (``counted_apart``) or store reader it refers to is not counted)."""
    seen: set[int] = set() if _seen is None else _seen
    stack, total = [obj], 0
    while stack:
        o = stack.pop()
        if o is None or id(o) in seen or isinstance(o, (StoreReader, type)) or getattr(o, "counted_apart", False):
            continue
        seen.add(id(o))
        if isinstance(o, np.ndarray):
            total += o.nbytes + sys.getsizeof(np.empty(0))
            if o.dtype == object:  # the objects it points to
                total += _items_bytes(o.ravel().tolist(), stack, seen)
        elif type(o).__module__.startswith("graph_tool"):
            total += _graph_tool_bytes(o)
        elif isinstance(o, (pa.Table, pa.Array, pa.ChunkedArray, pa.RecordBatch)):
            total += o.nbytes
        elif isinstance(o, dict):
            total += sys.getsizeof(o) + _items_bytes([x for kv in o.items() for x in kv], stack, seen)
        elif isinstance(o, (list, tuple, set, frozenset)):
            total += sys.getsizeof(o) + _items_bytes(o if isinstance(o, (list, tuple)) else list(o), stack, seen)
        else:
            total += sys.getsizeof(o)
            if type(o).__module__.startswith("memlib."):
                stack.extend(getattr(o, "__dict__", {}).values())
                stack.extend(getattr(o, a) for a in getattr(type(o), "__slots__", ()) if hasattr(o, a))
    return total


def _items_bytes(items: Sequence[Any], stack: list, seen: set[int]) -> int:
    """Few items go on the walk's ``stack`` (0 returned); many are measured by a sample, scaled."""
    n = len(items)
    if n <= SAMPLE_ITEMS:
        stack.extend(items)
        return 0
    sample = [items[(i * n) // SAMPLE_ITEMS] for i in range(SAMPLE_ITEMS)]
    measured = sum(approx_bytes(item, seen) for item in sample)
    return int(measured * n / SAMPLE_ITEMS)


# memory of a loaded graph-tool graph with memlib's property maps, beyond what numpy copies of
# them hold (measured by RSS: docs/decisions/0027-serving-cache.md)
GT_GRAPH_BYTES = 20_000
GT_VERTEX_BYTES = 110
GT_EDGE_BYTES = 50


def _graph_tool_bytes(g: Any) -> int:
    try:
        return GT_GRAPH_BYTES + GT_VERTEX_BYTES * int(g.num_vertices()) + GT_EDGE_BYTES * int(g.num_edges())
    except Exception:  # noqa: BLE001 - a property map or view: counted with its graph
        return 0
