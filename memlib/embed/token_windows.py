"""Long texts as overlapping windows of the token encoder's length, each token kept once.

MiniLM reads at most :data:`WINDOW` WordPiece positions ([CLS], 126 content tokens, [SEP]).
A longer text is cut into windows of that size whose content slices start ``WINDOW - 2 -
overlap`` tokens apart, at most ``max_windows`` of them (content past the last window is not
read). Every window is encoded with its own [CLS] and [SEP]. A content token covered by two
windows is kept from one of them only, split at the middle of the overlap, so each token keeps
at least ``overlap / 2`` tokens of context on both sides and a text's output is one vector per
content token, in text order, as for a short text. A text of at most ``WINDOW - 2`` content
tokens is one window, exactly the sequence the truncating tokenizer gives.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

WINDOW = 128
OVERLAP = 32
MAX_WINDOWS = 10


@dataclass(frozen=True)
class Window:
    text: int          # index of the text it belongs to
    ids: list[int]     # [CLS] + content slice + [SEP]
    keep_from: int     # window positions [keep_from, keep_to) are this window's share
    keep_to: int


def spec(overlap: int = OVERLAP, max_windows: int = MAX_WINDOWS) -> str:
    """Short name of a windowing, part of the encoder's tag."""
    return f"win{WINDOW}o{overlap}x{max_windows}"


def windows_of(text: int, ids: Sequence[int], overlap: int = OVERLAP, max_windows: int = MAX_WINDOWS) -> list[Window]:
    """The windows of one text's full token sequence ``ids`` ([CLS] ... [SEP], untruncated)."""
    size = WINDOW - 2
    if not 0 <= overlap < size:
        raise ValueError(f"window overlap must be in [0, {size}), got {overlap}")
    ids = list(ids)
    if len(ids) <= WINDOW:
        return [Window(text, ids, 1, max(len(ids) - 1, 1))]
    cls, content, sep = ids[0], ids[1:-1], ids[-1]
    step = size - overlap
    starts = list(range(0, len(content) - overlap, step))[:max(max_windows, 1)]
    out = []
    for w, start in enumerate(starts):
        end = min(start + size, len(content))
        first, last = w == 0, w == len(starts) - 1
        own_from = start if first else start + overlap // 2
        own_to = end if last else end - (overlap - overlap // 2)
        out.append(Window(text, [cls, *content[start:end], sep], 1 + own_from - start, 1 + own_to - start))
    return out


def split(encodings: Sequence[Sequence[int]], overlap: int = OVERLAP, max_windows: int = MAX_WINDOWS) -> list[Window]:
    """Windows of every text, in text order."""
    return [w for i, ids in enumerate(encodings) for w in windows_of(i, ids, overlap, max_windows)]


def padded(windows: Sequence[Window]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input ids, attention mask, share) of a batch, padded with id 0 to its longest window;
    ``share[row, pos]`` says whether that position is the window's own share."""
    width = max(len(w.ids) for w in windows)
    ids = np.zeros((len(windows), width), dtype=np.int64)
    mask = np.zeros((len(windows), width), dtype=np.int64)
    share = np.zeros((len(windows), width), dtype=bool)
    for row, w in enumerate(windows):
        ids[row, :len(w.ids)] = w.ids
        mask[row, :len(w.ids)] = 1
        share[row, w.keep_from:w.keep_to] = True
    return ids, mask, share


def first_window_rows(windows: Sequence[Window], outputs: Sequence[tuple[np.ndarray, np.ndarray]],
                      n_texts: int) -> list[int]:
    """Per text: how many of its output rows (content tokens) come from its first window."""
    heads = [-1] * n_texts
    for w, (ids, _) in zip(windows, outputs):
        if heads[w.text] < 0:
            heads[w.text] = len(ids)
    return [max(h, 0) for h in heads]


def joined(windows: Sequence[Window], outputs: Sequence[tuple[np.ndarray, np.ndarray]],
           n_texts: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per text: its windows' (token ids, vectors) concatenated in window order."""
    parts: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(n_texts)]
    for w, out in zip(windows, outputs):
        parts[w.text].append(out)
    return [p[0] if len(p) == 1 else (np.concatenate([i for i, _ in p]), np.concatenate([v for _, v in p]))
            for p in parts]
