"""What the tenant-level steps of a build read and write (:class:`BuildState`), shared by
:mod:`memlib.compose.reference`, which runs them, and :mod:`memlib.compose.steps`, which they are."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from memlib import schema
from memlib.compose.vectors import TurnVectors
from memlib.config import MemlibConfig

_log = logging.getLogger("memlib.compose.reference")


@dataclass
class BuildState:
    """What the tenant-level stages read and write."""
    turns: pa.Table
    cfg: MemlibConfig
    dim: int
    nlp: Any = None
    turn_vectors: np.ndarray | None = None
    segments: pa.Table | None = None
    nodes: list[pa.Table] = field(default_factory=list)
    edges: list[pa.Table] = field(default_factory=list)
    drafts: dict[str, pa.Table] = field(default_factory=dict)
    facts: pa.Table | None = None
    embedded_nodes: pa.Table | None = None
    node_vectors: np.ndarray | None = None    # the buffer of ``embedded_nodes``' embeddings (embed_nodes)
    extras: dict[str, Any] = field(default_factory=dict)  # backend handles (e.g. the LLM client), per worker
    token_vectors: TurnVectors | None = None  # the embed pass's output (token vectors, when kept)
    pooled_turns: bool = False                # turn vectors are the mean of those token vectors
    previous: Any = None                      # the tenant's published build (memlib.compose.reuse.PreviousTenant)
    changes: Any = None                       # turns added and removed since ``previous``, when that is all
                                              # that changed (memlib.compose.reuse.TurnChanges)
    changes_checked: bool = False             # ``changes`` was found (memlib.compose.extract_reuse.ensure_changes)
    prior: Any = None                         # what the extraction steps reuse of ``previous``, found once
                                              # (memlib.compose.extract_reuse.prior_of)
    extract_reuse: dict[str, int] = field(default_factory=dict)  # rows the extraction steps copied from ``previous``
    reused_vectors: int = 0                   # node vectors copied from ``previous``
    refilled_vectors: int = 0                 # node vectors given from their kept sums and the new means
    fallbacks: pa.Table | None = None         # schema.NODE_FALLBACKS of the derived nodes (token vectors only)
    token_sums: pa.Table | None = None        # schema.TOKEN_SUMS of the tenant's token rows (token vectors only)
    reuse_error: str | None = None            # why ``previous`` could not be reused (the steps ran in full)
    own_pass: Any = None                      # memlib.compose.vectors.OwnPass: own vectors of some derived kinds
    own_encoded: int = 0                      # node texts it encoded (the others copied from ``previous``)
    fact_vectors: pa.Table | None = None      # schema.FACT_VECTORS kept by the sessions (default embedder)
    beside: Any = None                        # memlib.compose.beside.BesideSteps: steps run on a side thread

    def add(self, nodes: pa.Table | None = None, edges: pa.Table | None = None) -> None:
        if nodes is not None and nodes.num_rows:
            self.nodes.append(schema.conform(nodes, schema.NODES_NO_EMBEDDING, name="nodes"))
        if edges is not None and edges.num_rows:
            self.edges.append(schema.conform(edges, schema.EDGES, name="edges"))

    def reusing(self, step: Callable[..., Any], *args: Any) -> Any:
        """``step(*args)``, a step's use of ``previous``; None when it raised (a damaged or
        unexpected published build): then this and the remaining steps run over the whole
        tenant, as in a full build, and the reason is reported."""
        try:
            return step(*args)
        except Exception as exc:  # noqa: BLE001 - a published build that cannot be reused is not reused
            self.reuse_error = reuse_failure(exc)
            self.changes = None
            self.reused_vectors = 0
            _log.warning("tenant build not reused: %s", self.reuse_error)
            return None

    def all_nodes(self) -> pa.Table:
        return pa.concat_tables(self.nodes) if self.nodes else schema.empty(schema.NODES_NO_EMBEDDING)

    def all_edges(self) -> pa.Table:
        return pa.concat_tables(self.edges) if self.edges else schema.empty(schema.EDGES)


def reuse_failure(exc: BaseException) -> str:
    """One line on why a tenant's published build could not be reused."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
