"""Texts encoded at once on threads (memlib.compose.vectors.one_by_one's ``workers``, what a run
in the driver uses) give exactly what the same encoder gives one text after another."""
from __future__ import annotations

import pytest

from memlib.compose.vectors import TurnEncoder
from memlib.config import MemlibConfig

pytestmark = pytest.mark.heavy

TEXTS = [
    "I adopted a puppy from the shelter last weekend.",
    "",
    "We went hiking in the mountains near Denver, then drove back through the night " * 12,  # several windows
    "My sister is getting married in June.",
    "The quarterly budget report is due on Friday.",
    "I started learning to play the violin.",
    "Our team won the regional chess tournament.",
]


def test_embed_workers_encode_texts_at_once_with_the_outputs_of_one_at_a_time():
    cfg = MemlibConfig()
    ids = [f"t{i}" for i in range(len(TEXTS))]
    alone = TurnEncoder(cfg, threads=1).encode(ids, TEXTS)
    together = TurnEncoder(cfg, threads=1, workers=3).encode(ids, TEXTS)  # the same cached model and kernel
    assert together.node_ids == alone.node_ids
    assert together.vectors.tobytes() == alone.vectors.tobytes()
    assert [a.tobytes() for a in together.token_ids] == [a.tobytes() for a in alone.token_ids]
    assert [a.tobytes() for a in together.token_vectors] == [a.tobytes() for a in alone.token_vectors]
