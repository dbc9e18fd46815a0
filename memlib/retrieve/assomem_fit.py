"""Fit AssoMem's per-question-type fusion weights (softmax(CMI/T)) on a labelled split and
write them as JSON (default memlib/retrieve/fitted/assomem.json)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import polars as pl

from memlib.retrieve import cmi
from memlib.retrieve.assomem import AssoMem, candidate_signals
from memlib.retrieve.intent import route


def labelled_pairs(index, questions: Iterable[tuple[str, list[str]]], params: dict[str, Any]
                   ) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
    """Per question with evidence: its type, the (candidates, signals) bins and labels."""
    types, bins, labels = [], [], []
    for question, evidence in questions:
        cand, sig = candidate_signals(index, question, params)
        if not cand:
            continue
        ev = {index.turn_by_source.get(e) for e in evidence}
        lab = np.fromiter((c in ev for c in cand), dtype=bool, count=len(cand))
        qbins = np.stack([cmi.rank_bins(np.asarray(sig[s], dtype=np.float64)) for s in cmi.SIGNALS], axis=1)
        types.extend([route(question).value] * len(cand))
        bins.append(qbins)
        labels.append(lab)
    return types, bins, labels


def fit_store(cache, questions: pl.DataFrame, tenants: list[str], temperature: float) -> dict[str, Any]:
    """Fit on the questions of ``tenants`` (columns tenant_id, question, evidence)."""
    params = AssoMem.defaults
    all_types: list[str] = []
    all_bins: list[np.ndarray] = []
    all_labels: list[np.ndarray] = []
    for tenant in tenants:
        rows = questions.filter(pl.col("tenant_id") == tenant).select("question", "evidence").rows()
        t, b, lab = labelled_pairs(cache.get(tenant), [(q, list(e or [])) for q, e in rows], params)
        all_types += t
        all_bins += b
        all_labels += lab
    if not all_bins:
        raise ValueError(f"no labelled candidates for tenants {tenants}")
    fitted = cmi.fit_weights(np.asarray(all_types), np.concatenate(all_bins), np.concatenate(all_labels),
                             temperature)
    return {"method": "softmax(CMI/T) per question type, 3 rank bins", "temperature": temperature,
            "tenants": tenants, "types": fitted}


def write_fitted(data: dict[str, Any], path: str | Path = cmi.FITTED_PATH) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return p
