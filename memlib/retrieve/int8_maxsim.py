"""The int8 similarity kernel of ``auto``'s MaxSim: a tenant's token vectors quantized per row to
7-bit int8 and packed into a two-op onnxruntime graph (why 7 bits: docs/int8-kernels.md)."""
from __future__ import annotations

import numpy as np

# the int8 matrix travels to onnxruntime inside a serialized model, which protobuf caps at
# 2 GiB: bigger tenants (over ~4M tokens) fall back to the float path
INT8_MAX_VALUES = 1_800_000_000


# Rows of the tenant's token matrix are quantized to [-INT8_QMAX, INT8_QMAX] (7 bits): onnxruntime's
# u8s8 kernels on CPUs without VNNI add two uint8 x int8 products in a saturating int16
# (vpmaddubsw), and 2 * 255 * 64 = 32640 < 2**15 keeps that sum exact (2 * 255 * 127 did not).
INT8_QMAX = 64


def quantize_rows(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scale per row float32, int8 rows in [-INT8_QMAX, INT8_QMAX]) with ``row ~ scale * int8``.
    Computed on float32 copies of bounded blocks: numpy's float16 arithmetic has no vector
    kernels (a 15,000-token tenant took 78 ms in float16, against a few ms this way); the
    values are the same, a float16's maximum being exact in float32."""
    n, dim = vectors.shape
    scale = np.empty(n, dtype=np.float32)
    v8 = np.empty((n, dim), dtype=np.int8)
    for start in range(0, n, 16_384):  # bounded float32 temporaries for big tenants
        block = vectors[start:start + 16_384].astype(np.float32)
        s = np.maximum(np.abs(block).max(axis=1), np.float32(1e-12)) / np.float32(INT8_QMAX)
        scale[start:start + 16_384] = s
        np.divide(block, s[:, None], out=block)
        np.rint(block, out=block)
        np.clip(block, -INT8_QMAX, INT8_QMAX, out=block)
        v8[start:start + 16_384] = block
    return scale, v8


class Int8Similarity:
    """``q @ V.T`` for one tenant's token vectors ``V`` on onnxruntime's int8 kernels.

    ``V`` is quantized once per row (symmetric, scale max|v|/:data:`INT8_QMAX`, so values in
    [-64, 64]) and becomes a constant of a two-op graph (DynamicQuantizeLinear of the query
    to uint8, MatMulInteger against ``V.T``), so onnxruntime pre-packs it for the CPU's int8
    dot-product units at session creation (~10 ms for 20k tokens). The reduced range makes
    the integer product exact on every kernel (VNNI, AVX2, AVX-512BW): the result equals
    numpy's integer computation of the same quantization, whatever the CPU. With full-range
    rows (+-127) an AVX2 box got cosines off by up to 0.054 on a 17k-token LoCoMo tenant
    (0.0034 where the kernel is exact) and the top 10 turns of idf-weighted MaxSim matched
    float's for 160 of 193 questions; with [-64, 64] cosines are off by at most 0.0061 (0.0030
    on random unit vectors) and 180 of 193 match, on any CPU. Measured on the 2-core AVX2
    box (docs/int8-kernels.md, docs/decisions/0005-int8-token-matrices.md) for an 11k-token
    tenant and the LoCoMo questions (9 tokens on average), one thread: 0.70 ms median (0.75 with rows in +-127, 0.76 as
    u8u8), against 2.4 ms for numpy's float32 ``V @ q.T``."""

    def __init__(self, vectors: np.ndarray):
        from onnx import TensorProto, helper, numpy_helper

        n, dim = vectors.shape
        scale, v8 = quantize_rows(vectors)
        v8t = np.ascontiguousarray(v8.T)
        graph = helper.make_graph(
            [helper.make_node("DynamicQuantizeLinear", ["q"], ["q8", "q_scale", "q_zero"]),
             helper.make_node("MatMulInteger", ["q8", "v8t", "q_zero"], ["dot"]),
             helper.make_node("Cast", ["dot"], ["dot_f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["dot_f", "v_scale"], ["dot_v"]),
             helper.make_node("Mul", ["dot_v", "q_scale"], ["sim"])],
            "int8_similarity",
            [helper.make_tensor_value_info("q", TensorProto.FLOAT, [None, dim])],
            [helper.make_tensor_value_info("sim", TensorProto.FLOAT, [None, n])],
            [numpy_helper.from_array(v8t, "v8t"), numpy_helper.from_array(scale[None, :], "v_scale")])
        self._sess = one_thread_session(graph)

    def __call__(self, q_vecs: np.ndarray) -> np.ndarray:
        """(Q, T) approximate cosines of the query token vectors with every token."""
        return self._sess.run(None, {"q": np.ascontiguousarray(q_vecs, dtype=np.float32)})[0]


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
