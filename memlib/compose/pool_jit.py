"""The compiled (numba) loops of the pool kernels (:mod:`memlib.compose.pool_kernels`), for inputs
too big for their numpy twins. Imported only when such an input comes (or a run that will have one
warms it, :func:`warm`): importing numba and loading the cached kernels costs about 0.7 CPU-s,
almost all of it holding the GIL, and a nightly that appends a session never needs them
(docs/decisions/0060-numba-only-for-big-pooling.md).

:func:`csr_times_turn_rows` reads each token row it weighs where it lies, converting float16 to
float32 on the fly, instead of first gathering the rows into a float32 copy: on a 500-session
LongMemEval tenant (877k token rows) the gather was 3.3 of the 7.8 s the node vectors took. Its
arithmetic is scipy's ``csr_matrix @ ndarray`` for float32 (``csr_matvecs``): per output row, the
products ``weight * row`` added into zeros in the CSR's column order, each product and sum rounded
to float32 (checked against scipy and the numpy twin in tests/compose/test_compose_pool_kernels.py).
"""
from __future__ import annotations

import numba as nb
import numpy as np
from numba import types
from numba.extending import overload
from numba.typed import List

_JIT = {"cache": True, "nogil": True}

# every float16 bit pattern -> its float32 value (exact): numba has no float16 type on the CPU
HALF_TO_FLOAT = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


def _as_float32(x, table):
    """``x`` as float32: a float as it is, a float16 stored as its uint16 bits through ``table``
    (what the overload below compiles; this body serves calls from Python)."""
    return np.float32(x) if isinstance(x, (float, np.floating)) else table[x]


@overload(_as_float32)
def _as_float32_impl(x, table):
    if isinstance(x, types.Float):
        return lambda x, table: np.float32(x)
    return lambda x, table: table[x]  # a float16 stored as its uint16 bits


@nb.njit(**_JIT)
def csr_times_turn_rows(csr, owner, starts, per_turn, table, dim):
    """(n_rows, dim) float32: with ``csr`` the weights' ``(indptr, indices, data)``, row ``i`` is
    ``sum_jj data[jj] * V[indices[jj]]`` in CSR order, where token row ``r`` of ``V`` is row
    ``r - starts[owner[r]]`` of ``per_turn[owner[r]]`` (float32, or float16 given as uint16 bits
    and converted through ``table``)."""
    indptr, indices, data = csr
    n = indptr.size - 1
    out = np.zeros((n, dim), np.float32)
    for i in range(n):
        for jj in range(indptr[i], indptr[i + 1]):
            r = indices[jj]
            t = owner[r]
            rows = per_turn[t]
            local = r - starts[t]
            a = data[jj]
            for k in range(dim):
                out[i, k] += a * _as_float32(rows[local, k], table)
    return out


@nb.njit(**_JIT)
def id_sums(slots, per_turn, table, dim, n_slots, scale):
    """((n_slots, dim) int64, (n_slots,) int64): per slot, the sum of its token rows in units of
    ``1 / scale`` (2^-24) and how many rows it has; ``slots[r]`` is the slot of token row ``r`` of the turns
    ``per_turn`` taken in order (float16 rows as uint16 bits through ``table``, or float32 ones,
    which are rounded to the nearest 2^-24)."""
    sums = np.zeros((n_slots, dim), np.int64)
    counts = np.zeros(n_slots, np.int64)
    r = 0
    for t in range(len(per_turn)):
        rows = per_turn[t]
        for local in range(rows.shape[0]):
            s = slots[r]
            r += 1
            counts[s] += 1
            for k in range(dim):
                sums[s, k] += np.int64(np.rint(np.float64(_as_float32(rows[local, k], table)) * scale))
    return sums, counts


def typed_rows(per_turn, dim: int):
    """The turns' token arrays as the kernels read them: float16 ones as their uint16 bits (with
    the float16 -> float32 table), anything else as float32; (typed list, table)."""
    half = all(v.dtype == np.float16 for v in per_turn)
    arrays = []
    for v in per_turn:
        v = v.reshape(-1, dim)
        v = v.view(np.uint16) if half else np.ascontiguousarray(v, dtype=np.float32).view()
        v.flags.writeable = False  # one array type for the list: arrays read back are read-only
        arrays.append(v)
    # one call: appending to a typed list one array at a time costs ~0.2 ms each (5 s at 26k turns)
    typed = List(arrays) if arrays else List.empty_list(types.Array(types.uint16 if half else types.float32,
                                                                    2, "C", readonly=True))
    return typed, (HALF_TO_FLOAT if half else np.zeros(1, np.float32))  # (the table is not read for float32)


def warm() -> None:
    """Load (or compile) the kernels and numba's typed list for float16 rows (what the build reads
    back) now: about a second in a new process."""
    one = np.array([0, 1], np.int64)
    rows = np.zeros((1, 2), np.uint16)
    rows.flags.writeable = False
    typed = List()
    typed.append(rows)
    csr_times_turn_rows((one, one[:1], np.ones(1, np.float32)), one[:1], one, typed, HALF_TO_FLOAT, 2)
    id_sums(one[:1], typed, HALF_TO_FLOAT, 2, 1, 1.0)
