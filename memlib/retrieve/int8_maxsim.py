"""The int8 similarity kernel of ``auto``'s MaxSim: a tenant's token vectors quantized per row to
7-bit int8 and packed into a two-op onnxruntime graph (why 7 bits: docs/int8-kernels.md)."""
from __future__ import annotations

import logging
import threading

import numpy as np

from memlib.embed.quantize import INT8_QMAX, quantize_rows  # noqa: F401 - the rows' quantization

log = logging.getLogger("memlib.retrieve")

# the int8 matrix travels to onnxruntime inside a serialized model, which protobuf caps at
# 2 GiB: bigger tenants (over ~4M tokens) fall back to the float path
INT8_MAX_VALUES = 1_800_000_000


# a tenant's rows are multiplied through one process-wide graph that takes them as an input, so
# opening a tenant builds no onnxruntime session; a tenant asked PREPACK_AFTER times with at least
# PREPACK_MIN_ROWS rows gets its own session with the rows as a pre-packed constant, built in the
# background (15,000 rows: 0.58 ms a query against 1.3 ms through the shared graph; building it
# took 250 ms, which a cold query used to pay: docs/decisions/0028-tenant-views.md)
PREPACK_AFTER = 8
PREPACK_MIN_ROWS = 2048


def _graph(dim: int, constant: tuple[np.ndarray, np.ndarray] | None = None):
    """q (Q, dim) float32 -> (Q, n) approximate cosines with the int8 rows ``v8t`` (dim, n) scaled by
    ``v_scale`` (1, n): inputs of the graph, or its constants when ``constant`` = (v8t, v_scale)."""
    from onnx import TensorProto, helper, numpy_helper

    rows = [helper.make_tensor_value_info("v8t", TensorProto.INT8, [dim, None]),
            helper.make_tensor_value_info("v_scale", TensorProto.FLOAT, [1, None])]
    inits = [] if constant is None else [numpy_helper.from_array(constant[0], "v8t"),
                                         numpy_helper.from_array(constant[1], "v_scale")]
    return helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["q"], ["q8", "q_scale", "q_zero"]),
         helper.make_node("MatMulInteger", ["q8", "v8t", "q_zero"], ["dot"]),
         helper.make_node("Cast", ["dot"], ["dot_f"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["dot_f", "v_scale"], ["dot_v"]),
         helper.make_node("Mul", ["dot_v", "q_scale"], ["sim"])],
        "int8_similarity",
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, [None, dim]), *([] if constant else rows)],
        [helper.make_tensor_value_info("sim", TensorProto.FLOAT, [None, None])], inits)


_SHARED: dict[int | str, object] = {}
_SHARED_LOCK = threading.Lock()


def _shared_session(dim: int):
    with _SHARED_LOCK:
        sess = _SHARED.get(dim)
        if sess is None:
            sess = _SHARED[dim] = one_thread_session(_graph(dim))
        return sess


def transposed(v8: np.ndarray) -> np.ndarray:
    """``v8.T`` (int8 rows (n, dim) -> (dim, n), C order) by onnxruntime's Transpose: the layout
    the kernel multiplies, made at a tenant's first query from the rows the build kept; 1.9 ms
    for 11,000 x 384 where numpy's strided copy took 5 ms and a tiled numba loop 6 ms."""
    v8 = np.ascontiguousarray(v8, dtype=np.int8)
    if v8.size == 0:
        return np.zeros((v8.shape[1], v8.shape[0]), np.int8)
    with _SHARED_LOCK:
        sess = _SHARED.get("transpose")
        if sess is None:
            from onnx import TensorProto, helper

            graph = helper.make_graph([helper.make_node("Transpose", ["a"], ["b"], perm=[1, 0])], "int8_transpose",
                                      [helper.make_tensor_value_info("a", TensorProto.INT8, [None, None])],
                                      [helper.make_tensor_value_info("b", TensorProto.INT8, [None, None])])
            sess = _SHARED["transpose"] = one_thread_session(graph)
    return sess.run(None, {"a": v8})[0]


class Int8Similarity:
    """``q @ V.T`` for one tenant's token vectors ``V`` on onnxruntime's int8 kernels.

    ``V`` is quantized once per row (symmetric, scale max|v|/:data:`INT8_QMAX`, so values in
    [-64, 64]); a query is quantized to uint8 (DynamicQuantizeLinear) and multiplied with the rows
    (MatMulInteger), through a graph shared by every tenant of the process, the rows an input;
    a tenant asked often enough gets a graph of its own with its rows a constant, which
    onnxruntime pre-packs for the CPU's int8 dot-product units (see :data:`PREPACK_AFTER`). Both
    give the same floats: the reduced range makes the integer product exact on every kernel
    (VNNI, AVX2, AVX-512BW), equal to numpy's integer computation of the same quantization,
    whatever the CPU. With full-range rows (+-127) an AVX2 box got cosines off by up to 0.054 on
    a 17k-token LoCoMo tenant (0.0034 where the kernel is exact) and the top 10 turns of
    idf-weighted MaxSim matched float's for 160 of 193 questions; with [-64, 64] cosines are off
    by at most 0.0061 (0.0030 on random unit vectors) and 180 of 193 match, on any CPU. Measured
    on the 2-core AVX2 box (docs/int8-kernels.md, docs/decisions/0005-int8-token-matrices.md) for
    an 11k-token tenant and the LoCoMo questions (9 tokens on average), one thread, pre-packed:
    0.70 ms median (0.75 with rows in +-127, 0.76 as u8u8), against 2.4 ms for numpy's float32
    ``V @ q.T``."""

    def __init__(self, vectors: np.ndarray | None = None, *, quantized: tuple[np.ndarray, np.ndarray] | None = None):
        """From float ``vectors`` (n, dim), or ``quantized`` = (scale (n,), int8 rows transposed (dim, n))."""
        if quantized is None:
            scale, v8 = quantize_rows(vectors)
            quantized = scale, transposed(v8)
        scale, v8t = quantized
        self.dim, self.n = int(v8t.shape[0]), int(v8t.shape[1])
        self._scale = np.ascontiguousarray(scale, dtype=np.float32)[None, :]
        self._v8t: np.ndarray | None = v8t
        self._own = None  # the tenant's own session, once built
        self._calls = 0
        self._building = False

    def __call__(self, q_vecs: np.ndarray) -> np.ndarray:
        """(Q, T) approximate cosines of the query token vectors with every token."""
        q = np.ascontiguousarray(q_vecs, dtype=np.float32)
        v8t = self._v8t  # read before the session: a finished prepack sets the session, then drops v8t
        if v8t is None:
            return self._own.run(None, {"q": q})[0]
        self._calls += 1
        if self._calls >= PREPACK_AFTER and self.n >= PREPACK_MIN_ROWS and not self._building:
            self._building = True
            threading.Thread(target=self._prepack, name="memlib-int8-prepack", daemon=True).start()
        return _shared_session(self.dim).run(None, {"q": q, "v8t": v8t, "v_scale": self._scale})[0]

    def _prepack(self) -> None:
        try:
            self._own = one_thread_session(_graph(self.dim, (self._v8t, self._scale)))
            self._v8t = None
        except Exception:  # noqa: BLE001 - the shared graph keeps answering
            log.warning("int8 rows of %d tokens: pre-packing failed; the shared graph answers", self.n, exc_info=True)

    @property
    def prepacked(self) -> bool:
        return self._v8t is None


def one_thread_session(graph):
    """An onnxruntime CPU session, one thread, of an ONNX ``graph`` (opset 17): the int8 kernels
    here run inside requests that the service already spreads over its cores."""
    import onnxruntime as ort
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"])
