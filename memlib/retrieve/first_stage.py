"""A cheap first stage for ``auto`` on big tenants: candidate turns before MaxSim.

MaxSim reads every token vector of the tenant for every query: linear in the tenant's size
(a LongMemEval-l haystack of 2,500 sessions holds about 5M content tokens). Above
``first_stage_turns`` turns ``auto`` scores only the candidates this stage selects:

* **Token postings.** Each row of the token matrix is a WordPiece id (the same ids the encoder
  read, recomputed by :meth:`~memlib.embed.token_encoder.TokenEncoder.content_ids` without running
  the model); per id present in the tenant, the turns holding it (CSR) and the *centroid* of
  its vectors (their normalized mean).
* **Query expansion.** Each query token is compared with the centroids (one small int8
  product, :class:`~memlib.retrieve.int8_maxsim.Int8Similarity`); it reaches the ids whose centroid
  is among its ``expand`` nearest with cosine at least ``min_cos``. Ids held by more than
  ``max_df`` of the turns are skipped (a frequent id's postings are long and say little).
* **Approximate MaxSim.** A turn's first-stage score is ``sum_q idf(q) * max cos(q, centroid)``
  over the expanded ids it holds: MaxSim with every token replaced by its id's centroid,
  restricted to the ids each query token reaches. The ``candidates`` best turns go on.

* **Near rows exact.** The candidates' MaxSim reads a row with the int8 kernel when some
  query token's centroid cosine with the row's token id reaches ``exact_min_cos``; the other
  rows (at 2,500 sessions about three quarters of the candidates' rows at 0.2) count with that
  centroid cosine, already computed. A row far from every query token rarely holds a turn's
  maximum, and feeding the rows to the kernel per query was the stage's main cost.

The cost is the centroid product (the tenant's distinct ids, not its tokens) plus the postings
of the reached ids; the exact MaxSim then reads the candidates' near rows only. Recall lost by the
stage is measured in docs/decisions/0015-first-stage.md (``memlib bench scale``, first stage on and
off).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memlib.lazy import cached_property
from memlib.retrieve import jit_kernels
from memlib.retrieve.int8_maxsim import Int8Similarity, one_thread_session, quantize_rows
from memlib.retrieve.late import TokenMatrix


class RowSimilarity:
    """``q @ V[rows].T`` for any subset of a tenant's token rows on onnxruntime's int8 kernels,
    with the quantization and kernel of :class:`~memlib.retrieve.int8_maxsim.Int8Similarity` (rows in
    [-64, 64] with a scale each, the query quantized to uint8 per call): the candidates' scores
    equal those the full int8 MaxSim gives them. The int8 rows are kept (a quarter of the
    float32 size) and the subset is fed to the graph per query."""

    def __init__(self, vectors: np.ndarray):
        from onnx import TensorProto, helper

        dim = vectors.shape[1]
        self.scale, self.v8 = quantize_rows(vectors)
        graph = helper.make_graph(
            [helper.make_node("DynamicQuantizeLinear", ["q"], ["q8", "q_scale", "q_zero"]),
             helper.make_node("Transpose", ["v8"], ["v8t"], perm=[1, 0]),
             helper.make_node("MatMulInteger", ["q8", "v8t", "q_zero"], ["dot"]),
             helper.make_node("Cast", ["dot"], ["dot_f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["dot_f", "v_scale"], ["dot_v"]),
             helper.make_node("Mul", ["dot_v", "q_scale"], ["sim"])],
            "int8_row_similarity",
            [helper.make_tensor_value_info("q", TensorProto.FLOAT, [None, dim]),
             helper.make_tensor_value_info("v8", TensorProto.INT8, [None, dim]),
             helper.make_tensor_value_info("v_scale", TensorProto.FLOAT, [1, None])],
            [helper.make_tensor_value_info("sim", TensorProto.FLOAT, [None, None])])
        self._sess = one_thread_session(graph)

    def __call__(self, q_vecs: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """(Q, len(rows)) approximate cosines of the query token vectors with those rows."""
        return self._sess.run(None, {"q": np.ascontiguousarray(q_vecs, dtype=np.float32),
                                     "v8": np.take(self.v8, rows, axis=0),  # twice as fast as v8[rows]
                                     "v_scale": np.take(self.scale, rows)[None, :]})[0]


@dataclass(frozen=True, eq=False)
class TokenPostings:
    """Per distinct token id of a tenant (``vocab``, sorted): the turns holding it
    (``turns[ptr[i]:ptr[i + 1]]``) and the unit centroid of its vectors."""

    vocab: np.ndarray       # (V,) int64 token ids
    ptr: np.ndarray         # (V + 1,) int64 offsets into turns
    turns: np.ndarray       # (P,) int32 turn positions, unique per id
    centroids: np.ndarray   # (V, dim) float32 unit vectors
    n_turns: int
    bounds: np.ndarray      # (n_turns + 1,) int64: turn i's rows are bounds[i]:bounds[i + 1]
    vectors: np.ndarray     # the matrix's token vectors (shared, not copied)
    row_vocab: np.ndarray   # (rows,) int32: each row's position in vocab

    @cached_property
    def df(self) -> np.ndarray:
        return np.diff(self.ptr)

    @cached_property
    def _followed(self) -> dict[float, np.ndarray]:
        return {}

    def followed(self, max_df: float) -> np.ndarray:
        """(V,) bool: ids held by at most ``max_df`` of the turns (at least one turn), kept per
        ``max_df`` (it is the same for every query)."""
        ok = self._followed.get(max_df)
        if ok is None:
            ok = self._followed[max_df] = self.df <= max(1.0, max_df * self.n_turns)
        return ok

    @cached_property
    def similarity(self) -> Int8Similarity:
        return Int8Similarity(self.centroids)

    @cached_property
    def rows(self) -> RowSimilarity:
        return RowSimilarity(self.vectors)


def build_postings(matrix: TokenMatrix, row_ids: np.ndarray, chunk: int = 262_144) -> TokenPostings:
    """:class:`TokenPostings` of ``matrix`` whose row ``i`` is token id ``row_ids[i]``."""
    from scipy import sparse

    vocab, pos = np.unique(row_ids, return_inverse=True)
    owner = matrix.owner.astype(np.int64)
    pairs = np.unique(pos.astype(np.int64) * max(matrix.n_turns, 1) + owner)
    ids_of_pair = pairs // max(matrix.n_turns, 1)
    ptr = np.r_[0, np.cumsum(np.bincount(ids_of_pair, minlength=vocab.size))].astype(np.int64)
    turns = (pairs % max(matrix.n_turns, 1)).astype(np.int32)
    dim = matrix.vectors.shape[1]
    sums = np.zeros((vocab.size, dim), dtype=np.float32)
    for start in range(0, row_ids.size, chunk):
        stop = min(start + chunk, row_ids.size)
        onehot = sparse.csr_matrix((np.ones(stop - start, dtype=np.float32),
                                    (pos[start:stop], np.arange(stop - start))), shape=(vocab.size, stop - start))
        sums += onehot @ matrix.vectors[start:stop].astype(np.float32)
    sums /= np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)
    bounds = np.searchsorted(owner, np.arange(matrix.n_turns + 1), side="left").astype(np.int64)
    return TokenPostings(vocab, ptr, turns, sums, matrix.n_turns, bounds, matrix.vectors, pos.astype(np.int32))


@dataclass(frozen=True)
class StageParams:
    candidates: int = 64      # turns (not an assistant's) passed to the exact MaxSim
    assistant_candidates: int = 8  # assistant turns passed to it
    expand: int = 32          # nearest ids per query token
    min_cos: float = 0.4      # least centroid cosine of a reached id
    max_df: float = 0.2       # ids held by more of the turns are not followed


def reached_ids(post: TokenPostings, sim: np.ndarray, p: StageParams) -> list[np.ndarray]:
    """Per query token: the vocabulary positions it reaches, ascending: the ``expand`` nearest
    centroids (``sim``, the (Q, V) centroid cosines; the lower id first among equal cosines) among
    ids held by at most ``max_df`` of the turns, whose cosine is at least ``min_cos``
    (:func:`memlib.retrieve.jit_kernels.reach_scan`)."""
    ids, cut = jit_kernels.reach_scan(sim, post.followed(p.max_df), np.float32(p.min_cos), p.expand)
    return [np.sort(ids[cut[q]:cut[q + 1]]) for q in range(sim.shape[0])]


def approximate_scores(post: TokenPostings, idf: np.ndarray, q_ids: np.ndarray, q_vecs: np.ndarray,
                       p: StageParams, sim: np.ndarray | None = None) -> np.ndarray:
    """Per turn: ``sum_q idf(q) * max cos(q, centroid(id))`` over the ids reached by ``q``
    that the turn holds (0 for a turn reached by no query token); ``sim``: the query's
    centroid cosines when already computed."""
    score = np.zeros(post.n_turns, dtype=np.float32)
    if q_ids.size == 0 or post.vocab.size == 0:
        return score
    sim = post.similarity(q_vecs) if sim is None else sim                    # (Q, V)
    ids, cut = jit_kernels.reach_scan(sim, post.followed(p.max_df), np.float32(p.min_cos), p.expand)  # reached_ids
    if cut[-1] == 0:
        return score
    return jit_kernels.walk_postings(sim, ids, cut, post.ptr, post.turns, idf[q_ids].astype(np.float32), post.n_turns)


def select(scores: np.ndarray, n: int) -> np.ndarray:
    """Positions of the ``n`` best first-stage scores, ascending; of equal scores at the cut, the
    first positions (copies of one session score alike: the choice never depends on which other
    turns were looked at)."""
    return jit_kernels.top_positions(scores, np.arange(scores.size), n)


def select_by_role(scores: np.ndarray, assistant: np.ndarray, n: int, n_assistant: int,
                   by_role: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """The ``n`` best turns that are not an assistant's and the ``n_assistant`` best assistant
    turns, ascending. ``auto``'s role prior puts an assistant turn ``assistant_penalty``
    standard deviations down, so only the very best of them can reach the top; they get a
    small share of the budget instead of crowding out the others (and long assistant turns
    are most of the rows the exact MaxSim would read). ``by_role``: those two position arrays,
    when already known (``TurnFrame.by_role``)."""
    other, asst = jit_kernels.split_reached(scores, assistant)  # usually a few thousand of the tenant's turns
    if other.size < n or asst.size < n_assistant:  # the best are not all among the reached turns
        other, asst = by_role if by_role is not None else (np.flatnonzero(~assistant), np.flatnonzero(assistant))
    return np.sort(np.r_[jit_kernels.top_positions(scores, other, n),           # select() over those turns
                         jit_kernels.top_positions(scores, asst, n_assistant)])


def maxsim_rows(matrix: TokenMatrix, post: TokenPostings, turns: np.ndarray, q_ids: np.ndarray,
                q_vecs: np.ndarray, use_idf: bool = True, exact: bool = False,
                centroid_sim: np.ndarray | None = None, exact_min_cos: float = -1.0) -> np.ndarray:
    """idf-MaxSim of the query against the turns at positions ``turns`` only (int8 kernels:
    the scores the full int8 MaxSim gives those turns; ``exact``: numpy float32).

    With ``centroid_sim`` (the query's (Q, V) centroid cosines) and ``exact_min_cos`` > -1, a
    row whose token id's centroid is below ``exact_min_cos`` for every query token keeps that
    centroid cosine instead of its own: such rows rarely hold a turn's maximum, and most rows
    of the candidates are such rows (measured in docs/decisions/0015-first-stage.md). The far rows are read in a
    compiled loop (:func:`memlib.retrieve.jit_kernels.far_rows`), the near rows by the int8 product
    (:class:`RowSimilarity`) or, with ``exact``, in float32."""
    out = np.zeros(turns.size, dtype=np.float32)
    if q_ids.size == 0 or turns.size == 0:
        return out
    bounds = post.bounds
    lo, hi = bounds[turns], bounds[turns + 1]
    has = hi > lo
    if not has.any():
        return out
    weights = matrix.idf[q_ids] if use_idf else np.ones(q_ids.size, dtype=np.float32)
    if centroid_sim is not None and exact_min_cos > -1.0:
        sim_t, vocab_best = jit_kernels.vocab_major(centroid_sim)
        best, near, owner = jit_kernels.far_rows(turns.astype(np.int64), bounds, post.row_vocab, sim_t, vocab_best,
                                                 np.float32(exact_min_cos))
        if near.size:
            near_sim = (np.ascontiguousarray((matrix.vectors[near].astype(np.float32) @ q_vecs.T).T, np.float32)
                        if exact else post.rows(q_vecs, near))                   # (Q, near rows)
            jit_kernels.fold_rows(best, near_sim, owner)
        out[has] = weights @ (best if has.all() else np.ascontiguousarray(best[:, has]))
        return out
    lengths = (hi - lo)[has]
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    rows = np.repeat(lo[has] - starts, lengths) + np.arange(lengths.sum())
    sim = ((matrix.vectors[rows].astype(np.float32) @ q_vecs.T).T if exact
           else post.rows(q_vecs, rows))                                         # (Q, rows)
    best = np.maximum.reduceat(sim, starts, axis=1)                              # (Q, turns with rows)
    out[has] = weights @ best
    return out


def postings_for(index, matrix: TokenMatrix, row_ids_fn) -> TokenPostings | None:
    """The postings of ``matrix``, built once per tenant view (``index.memo``, single flight);
    ``row_ids_fn()`` returns its rows' token ids, or None when they cannot be recovered (then
    None here too, and the caller scores every turn)."""
    def build() -> TokenPostings | None:
        row_ids = row_ids_fn()
        post = build_postings(matrix, row_ids) if row_ids is not None else None
        if post is not None:
            post.similarity, post.rows  # noqa: B018 - built once here, not by the first query
            jit_kernels.warm()
        return post

    return index.memo(("token_postings", id(matrix)), build)
