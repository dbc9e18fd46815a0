"""AssoMem fusion weights: softmax(CMI / T) per question type.

For every labelled (question, candidate turn) pair each signal is binned into
``n_bins`` (3) bins by its within-question rank (terciles); the label is whether the
turn is evidence. Per question type d, CMI_d(signal) = I(bin(signal); label | type = d),
estimated from counts. The weights of type d are softmax(CMI_d / T) over the signals."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SIGNALS = ("relevance", "importance", "temporal")
FALLBACK_WEIGHTS = {"relevance": 0.6, "importance": 0.25, "temporal": 0.15}
FITTED_PATH = Path(__file__).parent / "fitted" / "assomem.json"


def rank_bins(values: np.ndarray, n_bins: int = 3) -> np.ndarray:
    """Within-question bins by descending rank: 0 = top third."""
    n = values.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    rank = np.empty(n, dtype=np.int64)
    rank[np.argsort(-values, kind="stable")] = np.arange(n)
    return np.minimum(rank * n_bins // n, n_bins - 1)


def mutual_information(bins: np.ndarray, labels: np.ndarray, n_bins: int = 3) -> float:
    """I(bin; label) in nats from joint counts."""
    if bins.size == 0:
        return 0.0
    joint = np.zeros((n_bins, 2))
    np.add.at(joint, (bins, labels.astype(np.int64)), 1.0)
    joint /= joint.sum()
    pb, pl = joint.sum(1, keepdims=True), joint.sum(0, keepdims=True)
    nz = joint > 0
    return float((joint[nz] * np.log(joint[nz] / (pb @ pl)[nz])).sum())


def softmax(x: np.ndarray, temperature: float) -> np.ndarray:
    z = np.asarray(x, dtype=np.float64) / max(temperature, 1e-12)
    e = np.exp(z - z.max())
    return e / e.sum()


def fit_weights(types: np.ndarray, bins: np.ndarray, labels: np.ndarray, temperature: float = 0.01,
                n_bins: int = 3) -> dict[str, dict]:
    """``{type: {"weights": {signal: w}, "cmi": {signal: nats}, "n": pairs}}``.

    ``bins`` is (pairs, len(SIGNALS)); ``types`` and ``labels`` are per pair."""
    out: dict[str, dict] = {}
    for t in sorted(set(types.tolist())):
        m = types == t
        cmi = np.array([mutual_information(bins[m, j], labels[m], n_bins) for j in range(len(SIGNALS))])
        w = softmax(cmi, temperature)
        out[str(t)] = {"weights": dict(zip(SIGNALS, map(float, w))), "cmi": dict(zip(SIGNALS, map(float, cmi))),
                       "n": int(m.sum())}
    return out


def load_weights(path: str | Path | None = None) -> dict[str, dict[str, float]]:
    """``{type: {signal: weight}}`` from the fitted file; empty when there is none."""
    p = Path(path) if path else FITTED_PATH
    if not p.exists():
        return {}
    data = json.loads(p.read_text(encoding="utf-8"))
    return {t: v["weights"] for t, v in data.get("types", {}).items()}


def weights_for(fitted: dict[str, dict[str, float]], qtype: str) -> dict[str, float]:
    return fitted.get(qtype) or FALLBACK_WEIGHTS
