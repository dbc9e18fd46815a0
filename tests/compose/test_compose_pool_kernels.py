"""The pooling loops (memlib.compose.pool_kernels): the numpy twins give the compiled loops' bits
(memlib.compose.pool_jit), and numba is imported only for a big input or a warmed run."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from scipy import sparse

from memlib.compose import pool_kernels
from tests.conftest import REPO

DIM = 24


def _per_turn(rng, dtype, sizes):
    """Token rows of turns of ``sizes`` rows (some empty), over many magnitudes, with -0.0 values."""
    per_turn = []
    for n in sizes:
        v = rng.normal(size=(n, DIM)) * rng.choice([1e-7, 1e-3, 1.0, 300.0], size=(n, 1))
        v[rng.random(v.shape) < 0.05] = -0.0
        per_turn.append(v.astype(dtype))
    return per_turn


def _csr(rng, n_out, n_rows, nnz):
    """(indptr, indices, data) with empty output rows and repeated token rows within an output row,
    in no particular column order (a product adds its terms in the CSR's order, whatever it is)."""
    per_row = rng.integers(0, 2 * nnz // n_out + 1, n_out)
    per_row[rng.random(n_out) < 0.3] = 0
    indptr = np.r_[0, np.cumsum(per_row)].astype(np.int64)
    indices = rng.integers(0, n_rows, int(indptr[-1])).astype(np.int64)
    repeat = rng.random(indices.size) < 0.2
    indices[1:][repeat[1:]] = indices[:-1][repeat[1:]]  # the same row twice in a row of the matrix
    data = rng.uniform(0.001, 4.0, indices.size).astype(np.float32)
    return indptr, indices, data


@pytest.fixture
def numpy_only(monkeypatch):
    """The numpy twins, whatever else this process loaded."""
    monkeypatch.setattr(pool_kernels, "_LOADED", [])
    monkeypatch.setattr(pool_kernels, "JIT_FROM", 1 << 62)


def _compiled(fn, *args):
    pool_kernels.warm()
    assert pool_kernels.jit_loaded()
    return fn(*args)


def _both(monkeypatch, fn, *args):
    with monkeypatch.context() as m:
        m.setattr(pool_kernels, "_LOADED", [])
        m.setattr(pool_kernels, "JIT_FROM", 1 << 62)
        mine = fn(*args)
        assert not pool_kernels.jit_loaded()
    return mine, _compiled(fn, *args)


@pytest.mark.parametrize("dtype", ["float16", "float32", "mixed"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_numpy_product_is_the_compiled_one_to_the_bit(monkeypatch, dtype, seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 30, 40)
    sizes[[0, 7]] = 0
    if dtype == "mixed":  # float16 turns beside float32 ones: each converted exactly
        per_turn = [p.astype(np.float32) if i % 3 == 0 else p
                    for i, p in enumerate(_per_turn(rng, np.float16, sizes))]
    else:
        per_turn = _per_turn(rng, np.dtype(dtype), sizes)
    owner = np.repeat(np.arange(sizes.size, dtype=np.int64), sizes)
    starts = np.r_[0, np.cumsum(sizes)].astype(np.int64)
    csr = _csr(rng, 50, int(sizes.sum()), 600)
    rows = pool_kernels.TurnRows(per_turn, DIM)
    mine, compiled = _both(monkeypatch, pool_kernels.csr_times_turn_rows, csr, owner, starts, rows)
    assert mine.dtype == compiled.dtype == np.float32
    np.testing.assert_array_equal(mine.view(np.uint32), compiled.view(np.uint32))  # -0.0 and +0.0 told apart
    # and both are scipy's float32 product over the rows gathered in float32
    dense = np.concatenate([p.astype(np.float32) for p in per_turn])
    scipy = np.asarray(sparse.csr_matrix((csr[2], csr[1], csr[0]), shape=(50, dense.shape[0])) @ dense)
    np.testing.assert_array_equal(mine.view(np.uint32), scipy.view(np.uint32))


def test_numpy_product_of_nothing(numpy_only):
    rows = pool_kernels.TurnRows([np.zeros((3, DIM), np.float16)], DIM)
    empty = (np.zeros(4, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
    out = pool_kernels.csr_times_turn_rows(empty, np.zeros(3, np.int64), np.array([0, 3]), rows)
    assert out.shape == (3, DIM) and not out.any()
    none = (np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
    assert pool_kernels.csr_times_turn_rows(none, np.zeros(3, np.int64), np.array([0, 3]), rows).shape == (0, DIM)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_numpy_id_sums_are_the_compiled_ones(monkeypatch, dtype):
    """Exact int64 sums and counts; float32 values (not whole multiples of 2^-24) rounded alike;
    slots without rows stay zero."""
    rng = np.random.default_rng(4)
    sizes = rng.integers(0, 20, 30)
    per_turn = _per_turn(rng, np.dtype(dtype), sizes)
    slots = rng.integers(0, 90, int(sizes.sum())).astype(np.int64)
    slots[slots == 5] = 6  # slot 5: no row
    rows = pool_kernels.TurnRows(per_turn, DIM)
    (sums, counts), (want_sums, want_counts) = _both(monkeypatch, pool_kernels.id_sums, slots, rows, 90)
    np.testing.assert_array_equal(counts, want_counts)
    np.testing.assert_array_equal(sums, want_sums)
    assert counts[5] == 0 and not sums[5].any() and sums.dtype == np.int64
    flat = np.concatenate([p.astype(np.float64) for p in per_turn])
    np.testing.assert_array_equal(sums[7], np.rint(flat[slots == 7] * 2.0 ** 24).astype(np.int64).sum(axis=0))


def test_id_sums_of_no_row(numpy_only):
    rows = pool_kernels.TurnRows([np.zeros((0, DIM), np.float16)], DIM)
    sums, counts = pool_kernels.id_sums(np.zeros(0, np.int64), rows, 2)
    assert sums.shape == (2, DIM) and not sums.any() and counts.tolist() == [0, 0]


_SMALL_THEN_BIG = """
import sys
import numpy as np
from memlib.compose import pool_kernels
from memlib.compose.span_pool import IdSums
rng = np.random.default_rng(0)
ids = [rng.integers(0, 50, 40) for _ in range(20)]
vecs = [rng.normal(size=(40, 384)).astype(np.float16) for _ in range(20)]
small = IdSums.of(ids, vecs)
print("SMALL", "numba" in sys.modules)
n = pool_kernels.JIT_FROM // 384 // 40 + 1
big = IdSums.of(ids * n, vecs * n)
print("BIG", "numba" in sys.modules, pool_kernels.jit_loaded(), bool((big.sums == small.sums * n).all()))
"""


def test_numba_is_imported_only_for_a_big_input():
    res = subprocess.run([sys.executable, "-c", _SMALL_THEN_BIG], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SMALL False" in res.stdout and "BIG True True True" in res.stdout, res.stdout
