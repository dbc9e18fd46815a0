"""The tenant operator: a tenant's tenant-level stages, once every one of its sessions is kept.

A tenant row reaches the operator while the session operators may still be working on its
blocks; the actor waits until each block the tenant needs has its index file (the commit point
of :meth:`memlib.compose.session_store.SessionStore.write_block`), then reads the tenant's kept
session outputs and runs :func:`memlib.compose.reference.tenant_steps`, the graph and importance,
and writes the tenant's staged tables and ``auto``'s token matrix. A failed block (its failure
marker) or any exception of the tenant's own stages makes that tenant's summary an error; the
other tenants go on.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from memlib import schema
from memlib.compose.session_store import SessionStore
from memlib.compose.sessions import session_keys, sort_turns
from memlib.compose.vectors import own_pass
from memlib.config import MemlibConfig
from pipelines.context import BuildContext
from pipelines.rows import FAILED_DIR, Operator, RowKind, batch_of, failure_reason, on_ray, rows
from pipelines.shard import StagedFiles, TenantShard
from pipelines.tenant_part import write_part

log = logging.getLogger("memlib.build")


class SessionPassError(RuntimeError):
    """A block holding some of the tenant's sessions failed in a session operator."""


def _node_id() -> str | None:
    """The Ray node this actor runs on (None in the driver, :mod:`pipelines.inline`)."""
    if not on_ray():
        return None
    import ray

    return ray.get_runtime_context().get_node_id()


def tenant_item(shard: TenantShard, blocks: list[str], work: str | Path, pending: list[str],
                order: list[str] | None = None, kept: list[str] | None = None) -> dict[str, Any]:
    """One tenant of a tenant row: its shard, the blocks holding its sessions computed in this run,
    the keys of those sessions (``pending``; every other session of the tenant is kept already)
    and, when the driver computed them, all its session keys in session order and the blocks
    holding its other sessions (``kept``)."""
    return {"shard": shard.row(), "blocks": sorted(blocks), "work": str(work), "pending": sorted(pending),
            **({"order": order} if order is not None else {}), **({"kept": kept} if kept is not None else {})}


def pack_tenants(shards: list[TenantShard], batch_turns: int) -> list[list[TenantShard]]:
    """The tenant rows: each tenant of ``batch_turns`` turns or more alone (largest first), then
    the smaller ones together, up to ``batch_turns`` turns per row, in the order of their staged
    files (a row's tenants mostly share a file, read once per row)."""
    large = sorted((s for s in shards if s.turns >= batch_turns), key=lambda s: (-s.turns, s.tenant_id))
    rows: list[list[TenantShard]] = [[s] for s in large]
    batch: list[TenantShard] = []
    turns = 0
    for shard in sorted((s for s in shards if s.turns < batch_turns), key=lambda s: (s.turns_path, s.tenant_id)):
        if batch and turns + shard.turns > batch_turns:
            rows.append(batch)
            batch, turns = [], 0
        batch.append(shard)
        turns += shard.turns
    if batch:
        rows.append(batch)
    return rows


class TenantOp(Operator):
    """Tenant-level stages of one tenant from its kept session outputs; writes its staged tables."""
    kind = RowKind.TENANT
    reads = ("item",)            # the row's tenants: their shards and the blocks they wait for
    writes = ("summary",)        # one summary per tenant; its tables are written as one part
    num_cpus = 0.25
    pool = "tenant_actors"
    one_in_flight = True         # a row is seconds of work: it goes to an idle actor

    @classmethod
    def arguments(cls, ctx: BuildContext, res: Any) -> dict[str, Any]:
        """The run's context, and the LLM rate limiter all tenant actors share (an LLM recipe only)."""
        from pipelines.llm_actors import llm_steps, shared_limiter

        return {"ctx": ctx, "llm_limiter": shared_limiter(ctx.cfg) if llm_steps(ctx.cfg, ctx.recipe) else None}

    def __init__(self, ctx: BuildContext | MemlibConfig, *fields: str, llm_limiter: Any = None):
        """``ctx``: the run's context, or a config followed by a recipe, a store and a session key."""
        from memlib.compose.reference import prepare_tenant_steps
        from memlib.graph import tenant  # noqa: F401 - graph-tool's import, not on the first tenant

        ctx = BuildContext.of(ctx, *fields)
        cfg = ctx.cfg
        # while the first tenant's sessions are still computed; numba's pooling loops only when
        # the tenants are pooled whole (an incremental run loads them on a big input, if one comes)
        prepare_tenant_steps(cfg, ctx.recipe, kernels=not ctx.reuses_tenants)
        self.cfg = cfg
        self.recipe = ctx.recipe
        self.store_dir = ctx.store
        self.sessions = SessionStore(ctx.store, ctx.session_key, cfg.embed.dim, trust_unchanged=True)
        self.session_key = ctx.session_key
        self.staged = StagedFiles()
        self._kept = threading.Condition()  # notified as a run in the driver keeps a block
        self._stopped = False
        self._published: dict | None = None
        self._published_reader: Any = None  # a StoreReader of it
        self.nlp = None
        self.extras: dict[str, Any] | None = None
        self.llm_limiter = llm_limiter
        # start from the tenant's published build when this run only added or removed turns
        self.reuse = ctx.reuses_tenants
        self._encoder_tag: str | None = None
        # derived kinds embedded by their own text: with another backend than minilm-tokens their
        # vectors, loaded at the first tenant that has such nodes; with minilm-tokens only facts
        # their sessions did not keep a vector for (the LLM extractor's)
        self.own_pass = own_pass(cfg)
        if self.reuse:  # now, while this run's sessions are computed, not on the first tenant
            try:
                self._open_published()
            except Exception:  # noqa: BLE001 - a damaged published build is reported by the tenant it fails
                self._published = self._published_reader = None

    def __call__(self, batch: pa.Table) -> pa.Table:
        out = []
        for row in rows(batch):
            if row["kind"] == RowKind.TENANT.value:  # one or more tenants, each built alone
                row["summary"] = json.dumps(self.build_row(json.loads(row["item"])))
            out.append(row)
        return batch_of(out)

    def build_row(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Build each tenant of a row, then write the row's tenants that built as one part: one file
        per table (memlib.io.store), its staged nodes one file for the driver's Lance write."""
        summaries, built = [], []
        for item in items:
            shard = TenantShard(**item["shard"])
            try:
                summary, tables = self.build_one(shard, item["blocks"], Path(item["work"]), set(item["pending"]),
                                                 item.get("order"), item.get("kept"))
                built.append(tables)
            except Exception as exc:  # noqa: BLE001 - one tenant's failure is reported, never another's
                summary = {"tenant_id": shard.tenant_id, "error": failure_reason(exc)}
            summaries.append(summary)
        if not built:
            return summaries
        try:
            part, nodes_path = write_part(TenantShard(**items[0]["shard"]).version_dir, built, self.cfg.embed.dim)
            written = {"part": part, "nodes_path": nodes_path}
        except Exception as exc:  # noqa: BLE001 - the row's tenants fail by name; other rows go on
            written = {"error": f"its part could not be written: {failure_reason(exc)}"}
        for summary in summaries:
            if "error" not in summary:
                summary.update(written)
        return summaries

    def wait_for_blocks(self, blocks: list[str], work: Path) -> float:
        """Seconds spent waiting until every block in ``blocks`` is kept (its index file exists)."""
        start, delay = time.perf_counter(), 0.02
        index, failed = self.sessions.root / "index", work / FAILED_DIR
        timeout = self.cfg.ray.tenant_wait_s
        while True:
            for b in blocks:
                if (failed / f"{b}.json").exists():
                    reason = json.loads((failed / f"{b}.json").read_text(encoding="utf-8"))["error"]
                    raise SessionPassError(f"block {b} with some of its sessions failed: {reason}")
            if all((index / f"{b}.parquet").exists() for b in blocks):
                return time.perf_counter() - start
            if time.perf_counter() - start > timeout:
                raise SessionPassError(f"its sessions were not kept within ray.tenant_wait_s={timeout:g}")
            if self._stopped:
                raise SessionPassError("the session pass stopped before its blocks were kept")
            with self._kept:
                self._kept.wait(delay)
            delay = min(delay * 1.5, 0.5)

    def blocks_kept(self, stop: bool = False) -> None:
        """Wake the tenants waiting for blocks now (a run in the driver calls it as it keeps each
        block; with ``stop``, no more will be kept: they fail). On Ray they poll."""
        with self._kept:
            self._stopped = self._stopped or stop
            self._kept.notify_all()

    def _extras(self) -> dict[str, Any]:
        if self.extras is None:
            from pipelines.llm_actors import llm_extras, llm_steps

            uses_llm = bool(llm_steps(self.cfg, self.recipe))
            self.extras = llm_extras(self.cfg, self.store_dir, self.llm_limiter) if uses_llm else {}
        return self.extras

    def read_sessions(self, order: list[str], blocks: list[str], work: Path,
                      pending: set[str], kept_blocks: list[str] | None = None) -> tuple[Any, Any, float]:
        """The kept outputs of every session in ``order``: first those kept by earlier runs (read
        while this run's blocks are still computed; never one of ``pending``, the sessions this
        run computes), then, once ``blocks`` are kept, the others. ``kept_blocks``: the blocks
        holding the earlier sessions, when the driver named them (then only their index files
        are read, not the whole index: 24 ms a tenant at 10,000 tenants). Returns (outputs, turn
        vectors, seconds waited for the blocks)."""
        from memlib.compose.sessions import SessionOutput
        from memlib.compose.vectors import TurnVectors
        from pipelines.prefetch import take_kept

        earlier = [k for k in order if k not in pending]
        if kept_blocks is not None:
            kept = set(earlier)
            # read ahead by the driver once the sessions were planned (a run in the driver), or now
            ahead = take_kept(self.store_dir, self.session_key, earlier, kept_blocks) if earlier else None
            parts = [] if not earlier else [ahead.result()] if ahead is not None else \
                [self.sessions.read(earlier, kept_blocks)]
        else:
            if earlier:
                self.sessions.refresh()  # blocks written since this actor last read the index
            kept = self.sessions.known(earlier)
            parts = [self.sessions.read([k for k in order if k in kept])] if kept else []
        waited = self.wait_for_blocks(blocks, work)
        now = [k for k in order if k not in kept]
        if now:  # this run's sessions: looked up in the blocks the tenant waited for
            parts.append(self.sessions.read(now, blocks))
        outputs = SessionOutput.concat([p for p, _ in parts])
        vectors = TurnVectors.concat([v for _, v in parts], self.cfg.embed.dim)
        return outputs, vectors, waited

    def build_one(self, shard: TenantShard, blocks: list[str], work: Path, pending: set[str],
                  order: list[str] | None = None,
                  kept: list[str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """The tenant's summary and its tables (table name -> Arrow table; ``graphs``: its bytes).
        ``order``: its session keys in session order (computed from its turns when not given);
        ``kept``: the blocks holding its sessions kept by earlier runs, when the driver named them."""
        from memlib.compose.reference import StepTools, TenantSessions, tenant_steps
        from memlib.io.lance_checks import LANCE_DIGEST_KEY, tenant_digest
        from memlib.io.lance_delta import lance_delta
        from pipelines.llm_actors import call_summary, drain_llm_calls

        start, cpu = time.perf_counter(), time.process_time()
        turns = sort_turns(self.staged.rows(shard.turns_path, shard.tenant_id))
        if order is None:
            order = list(dict.fromkeys(session_keys(turns, self.session_key).to_pylist()))
        previous_of = self._previous_soon(shard.tenant_id)  # read while this run's blocks are computed
        parts, vectors, waited = self.read_sessions(order, blocks, work, pending, kept)
        previous, unreadable = previous_of()
        start += waited  # the tenant's own seconds: reading (its turns too) and its stages, not the wait
        read_s = time.perf_counter() - start
        extras = self._extras()
        out = tenant_steps(TenantSessions(turns, parts, vectors, order, previous), self.cfg, self.recipe,
                           StepTools(self.nlp, extras, self.own_pass))
        # the graph (graph-tool's C++ parts release the GIL), then the digest of the tenant's Lance rows
        # (crc32 and numpy's gathers release it too), on another thread, while this one compares those
        # rows with the published ones and refers to its token matrix: none of these reads importance
        # (the Lance rows clear it)
        with ThreadPoolExecutor(1, thread_name_prefix="memlib-graph") as pool:
            graphed = pool.submit(self._graph, out)
            digested = pool.submit(tenant_digest, out.nodes)
            delta = lance_delta(out.nodes, previous.rows if previous is not None else None,
                                previous.rows_keyed if previous is not None else None)
            matrix_ref = self._timed_matrix_ref(shard, out, order)
            nodes, graph, held = graphed.result()
            digest = digested.result()
        tables = {"nodes": nodes, "lance_rows": delta.rows, "memory_graphs": {shard.tenant_id: held},
                  "node_importance": nodes.select(["tenant_id", "node_id", "importance"]), "edges": out.edges,
                  "segments": out.segments, "turns": turns,
                  "node_fallbacks": out.fallbacks, "token_sums": out.token_sums, "graphs": {shard.tenant_id: graph},
                  "questions": (self.staged.rows(shard.questions_path, shard.tenant_id) if shard.questions_path
                                else None)}
        if matrix_ref is not None:
            tables["matrix_refs"] = matrix_ref
        calls = drain_llm_calls(extras)
        tables["llm_calls"] = calls
        llm = call_summary(calls)
        out.timings["read_sessions"] = round(read_s, 3)
        reused = out.reused or ({"appended_only": 0, "error": unreadable} if unreadable else {})
        if delta.delete is not None:  # its published Lance rows that stay as they are
            reused = {**reused, "lance_rows_kept": previous.rows.num_rows - len(delta.delete)}
        questions = tables["questions"].num_rows if tables["questions"] is not None else 0
        return {"tenant_id": shard.tenant_id, "turns": turns.num_rows, "sessions": len(order), "questions": questions,
                "waited_s": round(waited, 3), "timings": out.timings, "seconds": round(time.perf_counter() - start, 3),
                "cpu_s": round(time.process_time() - cpu, 3), "pid": os.getpid(),
                "node_id": _node_id(), **out.counts(),
                LANCE_DIGEST_KEY: digest,  # its Lance rows as written, checked where read
                **({"llm": llm} if llm else {}), **({"reused": reused} if reused else {}),
                # the published Lance rows to delete before its rows are added; absent: all of them
                **({"lance_delete": delta.delete} if delta.delete is not None else {})}, tables

    def _previous_soon(self, tenant: str) -> Callable[[], tuple[Any, str | None]]:
        """:meth:`_previous` read now, or, when the driver reads it on another thread (a run in the
        driver: pipelines/prefetch.py), once the caller has read the tenant's kept sessions meanwhile."""
        from pipelines.prefetch import take_previous

        ahead = take_previous(self.store_dir, self.session_key, tenant) if self.reuse else None
        if ahead is not None:
            return lambda: self._previous(tenant, ahead)
        now = self._previous(tenant)
        return lambda: now

    def _previous(self, tenant: str, ahead: Future | None = None) -> tuple[Any, str | None]:
        """The tenant's published build, when reuse is on and it was built under this run's key,
        and why it could not be read (then None: the tenant steps run in full, and the tenant is
        still built; reuse only saves time). ``ahead``: the build being read on another thread."""
        if not self.reuse:
            return None, None
        from memlib.compose.reuse import load_previous
        from memlib.compose.state import reuse_failure

        try:
            if ahead is not None:
                return ahead.result(), None
            self._open_published()
            return load_previous(self.store_dir, tenant, self.session_key, self._published,
                                 reader=self._published_reader), None
        except Exception as exc:  # noqa: BLE001 - a damaged published build never fails the tenant
            return None, reuse_failure(exc)

    def _open_published(self) -> None:
        """Read the version published when this run started, once, and open its Lance table for all
        the actor's tenants (lancedb's import and the first open are 1-2 CPU-s)."""
        if self._published is None:
            from memlib.io.store import read_manifest
            from pipelines.prefetch import open_published

            try:
                self._published, self._published_reader = open_published(self.store_dir)
            except Exception:
                self._published = read_manifest(self.store_dir) or {}  # a tenant it does not name needs no table
                raise

    def _graph(self, out: Any) -> tuple[pa.Table, bytes, Any]:
        """The tenant's nodes with the global importance of its graph-tool graph, the graph's bytes
        and the graph (its memory view is made from it)."""
        from memlib.graph.tenant import build_tenant_graph
        from pipelines.store_sink import with_importance

        t0 = time.perf_counter()
        cols = [c for c in out.nodes.column_names if c != "embedding"]
        importance, data, graph = build_tenant_graph(out.nodes.select(cols), out.edges, self.cfg.graph)
        out.timings["graph"] = round(time.perf_counter() - t0, 3)
        return schema.conform(with_importance(out.nodes, importance), out.nodes.schema, name="nodes"), data, graph

    def _timed_matrix_ref(self, shard: TenantShard, out: Any, sessions: list[str]) -> pa.Table | None:
        """:meth:`_matrix_ref` when the tenant steps made a token matrix (None otherwise), its seconds in
        ``out.timings``."""
        if out.matrix_turns is None:
            return None
        t0 = time.perf_counter()
        ref = self._matrix_ref(shard, out, sessions)
        out.timings["token_matrix"] = round(time.perf_counter() - t0, 3)
        return ref

    def _matrix_ref(self, shard: TenantShard, out: Any, sessions: list[str]) -> pa.Table:
        """``auto``'s token matrix of the tenant: its ``matrix_refs`` row, a reference to the token
        vectors its ``sessions`` kept (memlib.retrieve.matrix_cache), keyed by its turns' texts."""
        from memlib.compose.vectors import auto_encoder_model
        from memlib.embed import token_model
        from memlib.retrieve import matrix_cache

        # the turns' texts looked up in Arrow (a dict of every node's id and text was 108k of each)
        at = pc.index_in(pa.array(out.matrix_turns, pa.string()), value_set=out.nodes.column("node_id"))
        if at.null_count:
            raise KeyError(f"{at.null_count} token-matrix turns are not nodes of the tenant")
        texts = out.nodes.column("text").take(at).to_pylist()
        if self._encoder_tag is None:  # the derived model's digest: hashed once per actor
            self._encoder_tag = token_model.model_file(auto_encoder_model(self.cfg), self.cfg.embed.model_cache)[1]
        return matrix_cache.reference_row(shard.tenant_id, out.matrix_turns, texts, self._encoder_tag, self.session_key,
                                          sessions)
