"""The two loops of the build's derived-node pooling (memlib/compose/span_pool.py), in numpy for
small inputs and compiled with numba (:mod:`memlib.compose.pool_jit`) for big ones; both give the
same bits, so which one runs does not change a vector.

:func:`csr_times_turn_rows` is ``weights @ V`` where ``V`` is every token row of a tenant's turns
(each turn's rows a float16 array of its own, as read back from the kept session outputs) and
``weights`` a sparse (nodes x token rows) matrix in CSR form: per output row, the products
``weight * row`` (float16 converted to float32 exactly) rounded to float32 and added into zeros in
the CSR's order, as scipy's float32 product does.

:func:`id_sums` sums a tenant's token rows per WordPiece id exactly: each float16 value is an
integer number of 2^-24 (the smallest float16), so the sums are int64 and do not depend on the
order of their terms (:class:`memlib.compose.span_pool.IdSums`).

The compiled loops run once numba is loaded (a full build warms it: :func:`warm`) or for an input
of at least :data:`JIT_FROM` values (products, or summed values), which loads it: importing numba
and loading the cached kernels costs ~0.7 CPU-s, almost all of it holding the GIL, against
milliseconds of numpy for what a nightly that appends a session pools (a few thousand rows). At
the crossover numpy takes 0.04 s (product) and 0.08 s (sums), about a tenth of that load
(measured: docs/decisions/0060-numba-only-for-big-pooling.md).
"""
from __future__ import annotations

from typing import Any

import numpy as np

# every float16 is a whole multiple of 2^-24, its smallest subnormal
SUM_SCALE = float(1 << 24)

# products (CSR entries x dim) or summed values (rows x dim) from which the compiled loops run
JIT_FROM = 1 << 23
# token rows of a turn, about (the nightlies measured: LoCoMo 132, LongMemEval 96-117)
ROWS_PER_TURN = 128


def pools_big(turns: int, dim: int) -> bool:
    """Whether pooling a whole tenant of ``turns`` turns likely takes the compiled loops: its
    per-id sums read every token row (a prediction, to load them ahead; the loops decide)."""
    return turns * ROWS_PER_TURN * dim >= JIT_FROM


class TurnRows:
    """A tenant's turns' token arrays (each ``(rows, dim)``, float16 or float32) as both kinds of
    kernel read them; the compiled loops' typed list is made on their first use, once."""

    def __init__(self, per_turn: list[np.ndarray], dim: int) -> None:
        self.per_turn = [v.reshape(-1, dim) for v in per_turn]
        self.dim = dim
        self._jit: tuple[Any, np.ndarray] | None = None

    def jit(self) -> tuple[Any, np.ndarray]:
        """(typed list, float16 table) for :mod:`memlib.compose.pool_jit`."""
        if self._jit is None:
            from memlib.compose import pool_jit

            self._jit = pool_jit.typed_rows(self.per_turn, self.dim)
        return self._jit


def csr_times_turn_rows(csr: tuple[np.ndarray, np.ndarray, np.ndarray], owner: np.ndarray, starts: np.ndarray,
                        rows: TurnRows) -> np.ndarray:
    """(n_rows, dim) float32: with ``csr`` the weights' ``(indptr, indices, data)`` (int64, int64,
    float32), row ``i`` is ``sum_jj data[jj] * V[indices[jj]]`` in CSR order, where token row ``r``
    of ``V`` is row ``r - starts[owner[r]]`` of ``rows.per_turn[owner[r]]``."""
    jit = _compiled(csr[1].size * rows.dim)
    if jit is not None:
        typed, table = rows.jit()
        return jit.csr_times_turn_rows(csr, owner, starts, typed, table, rows.dim)
    return _csr_numpy(csr, owner, starts, rows)


def id_sums(slots: np.ndarray, rows: TurnRows, n_slots: int) -> tuple[np.ndarray, np.ndarray]:
    """((n_slots, dim) int64, (n_slots,) int64): per slot, the sum of its token rows in units of
    2^-24 and how many rows it has; ``slots[r]`` (int64) is the slot of token row ``r`` of the
    turns taken in order (float32 values are rounded to the nearest 2^-24)."""
    jit = _compiled(slots.size * rows.dim)
    if jit is not None:
        typed, table = rows.jit()
        return jit.id_sums(slots, typed, table, rows.dim, n_slots, SUM_SCALE)
    return _id_sums_numpy(slots, rows, n_slots)


_LOADED: list[Any] = []  # memlib.compose.pool_jit, once imported and warmed in this process


def warm() -> None:
    """Import numba and load (or compile) the compiled loops now, for a run that will need them
    (:func:`memlib.compose.reference.prepare_tenant_steps`): about a second in a new process.
    From then on every input goes through them (faster than numpy at any size)."""
    from memlib.compose import pool_jit

    pool_jit.warm()
    if not _LOADED:
        _LOADED.append(pool_jit)


def jit_loaded() -> bool:
    """Whether the compiled loops are loaded in this process."""
    return bool(_LOADED)


def _compiled(values: int) -> Any:
    """The compiled loops' module when they are loaded or ``values`` calls for them (then loaded
    now), else None (numpy)."""
    if not _LOADED and values >= JIT_FROM:
        warm()
    return _LOADED[0] if _LOADED else None


def _csr_numpy(csr: tuple[np.ndarray, np.ndarray, np.ndarray], owner: np.ndarray, starts: np.ndarray,
               rows: TurnRows) -> np.ndarray:
    """:func:`csr_times_turn_rows` in numpy: the weighed rows gathered in CSR order (float32,
    exact) and scaled in place, then added into zeros one position at a time: step ``p`` adds the
    ``p``-th product of every output row that has one (rows by length, longest first), so each
    row's sums are rounded in the CSR's order. Only elementwise operations: ``np.add.reduceat``
    sums a segment in another order (pairwise), which changes low bits."""
    indptr, indices, data = csr
    n = indptr.size - 1
    out = np.zeros((n, rows.dim), np.float32)
    if n == 0 or indptr[-1] == indptr[0]:
        return out
    indices, data = indices[indptr[0]:indptr[-1]], data[indptr[0]:indptr[-1]]
    gathered = np.empty((indices.size, rows.dim), np.float32)
    turn = owner[indices]
    order = np.argsort(turn, kind="stable")
    bounds = np.flatnonzero(np.diff(turn[order])) + 1
    for group in np.split(order, bounds):  # the rows of one turn at a time (float16 -> float32 is exact)
        t = int(turn[group[0]])
        gathered[group] = rows.per_turn[t][indices[group] - starts[t]]
    gathered *= data[:, None]
    lengths = np.diff(indptr)
    longest = np.argsort(-lengths, kind="stable")
    length, first = lengths[longest], indptr[:-1][longest] - indptr[0]
    acc = np.zeros((n, rows.dim), np.float32)  # the rows by length, longest first
    for p in range(int(length[0])):
        m = int(np.searchsorted(-length, -p, side="left"))  # the rows longer than p: a prefix
        acc[:m] += gathered[first[:m] + p]
    out[longest] = acc
    return out


def _id_sums_numpy(slots: np.ndarray, rows: TurnRows, n_slots: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`id_sums` in numpy: every value as an int64 number of 2^-24, summed per slot (exact
    integers: the order of the terms does not matter). ``x * 2^24`` is exact in float32 (a power
    of two), and its ``rint`` there is the compiled loop's ``rint`` in float64 of the same value."""
    counts = np.bincount(slots, minlength=n_slots).astype(np.int64)
    sums = np.zeros((n_slots, rows.dim), np.int64)
    if slots.size == 0:
        return sums, counts
    order = np.argsort(slots, kind="stable")
    flat = np.concatenate(rows.per_turn, dtype=np.float32)[order]  # by slot; float16 -> float32 is exact
    flat *= np.float32(SUM_SCALE)
    values = np.rint(flat, out=flat).astype(np.int64)
    firsts = np.r_[0, np.flatnonzero(np.diff(slots[order])) + 1]
    sums[slots[order[firsts]]] = np.add.reduceat(values, firsts, axis=0)
    return sums, counts
