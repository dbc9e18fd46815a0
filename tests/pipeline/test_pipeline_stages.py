"""The staged build's parts: operator column contracts, kept session outputs and their reuse by
a nightly run (unchanged sessions not recomputed, changed ones recomputed, deleted ones gone with
everything derived from them), and the embed operator's resources from config (fake GPU)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memlib.compose.session_store import SessionStore
from memlib.compose.sessions import SESSION_TABLES, keyed_schema
from memlib.config import MemlibConfig
from memlib.io.store import StoreReader
from tests.pipeline.conftest import SESSIONS, run_cli, turn_lines

pytestmark = pytest.mark.ray
REPO = Path(__file__).resolve().parents[2]


def _shards(tmp_path: Path, cfg: MemlibConfig):
    """Tenant shards of the tiny input written into a store version directory, as the driver does."""
    from memlib.io.store import StoreWriter
    from pipelines.shard import shard_input

    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(turn_lines()) + "\n", encoding="utf-8")
    writer = StoreWriter(tmp_path / "store", dim=cfg.embed.dim)
    return writer, shard_input(inp, "jsonl", cfg, writer).shards


def _only_declared_changed(before: dict, after: dict, io: tuple, mine: bool) -> None:
    """An operator returns every ROW column; for its kind of row it writes only its declared
    outputs (or an error summary), for the other kind it changes nothing."""
    from pipelines.operators import ROW

    assert tuple(after.column_names) == ROW
    reads, writes = io
    for col in ROW:
        if not mine or col not in (*writes, "summary", *reads):
            assert after.column(col).to_pylist() == before.column(col).to_pylist(), col
    if mine:
        assert all(after.column(c)[0].as_py() is not None for c in writes), writes


def test_operators_read_and_write_their_declared_columns(ray_local, tmp_path):
    from pipelines import operators as ops
    from pipelines.staged_build import plan_sessions
    from pipelines.tenant_op import TenantOp, tenant_item

    cfg = MemlibConfig()
    writer, shards = _shards(tmp_path, cfg)
    store = SessionStore(writer.path, "k", cfg.embed.dim)
    plan = plan_sessions(shards, store, "k", tmp_path / "work" / "blocks", block_turns=7)
    assert plan.pending == plan.sessions == 5 and len(plan.blocks) == 4
    assert sorted(b for bs in plan.tenant_blocks.values() for b in bs) == sorted(Path(p).stem for p in plan.blocks) \
        or set(Path(p).stem for p in plan.blocks) <= {b for bs in plan.tenant_blocks.values() for b in bs}
    block = ops.batch_of([{"kind": "block", "item": ops.block_item(plan.blocks[0]), "turns": None,
                           "vectors": None, "summary": None}])
    tenant = ops.batch_of([{"kind": "tenant", "item": json.dumps([tenant_item(shards[0], [], tmp_path / "work", [])]),
                            "turns": None, "vectors": None, "summary": None}])
    read = ops.turn_nodes_op(block, cfg)
    _only_declared_changed(block, read, ops.TURN_NODES_IO, mine=True)
    _only_declared_changed(tenant, ops.turn_nodes_op(tenant, cfg), ops.TURN_NODES_IO, mine=False)
    embed = ops.EmbedOp(cfg, threads=1)
    embedded = embed(read)
    _only_declared_changed(read, embedded, ops.EMBED_IO, mine=True)
    _only_declared_changed(tenant, embed(tenant), ops.EMBED_IO, mine=False)
    vectors = ops.from_ipc(embedded.column("vectors")[0].as_py())
    assert vectors.schema.remove_metadata().equals(__import__("memlib").schema.turn_vectors_schema(cfg.embed.dim))
    local = ops.SessionLocalOp(cfg, "full", str(writer.path), "k")
    kept = local(embedded)
    assert kept.column_names == list(ops.ROW) and kept.column("summary")[0].as_py()
    assert kept.column("turns")[0].as_py() is None  # kept on disk: nothing big goes on
    _only_declared_changed(tenant, local(tenant), ops.SESSION_LOCAL_IO, mine=False)
    summary = json.loads(kept.column("summary")[0].as_py())
    block_dir = store.root / "blocks" / summary["block_id"]
    for name in SESSION_TABLES:
        got = pa.ipc.open_file(pa.memory_map(str(block_dir / f"{name}.arrow"))).schema
        assert got.remove_metadata().equals(keyed_schema(name)), name
    keys = set(ops.from_ipc(read.column("turns")[0].as_py()).column("session_key").to_pylist())
    assert SessionStore(writer.path, "k", cfg.embed.dim).known(keys) == keys
    _only_declared_changed(kept, TenantOp(cfg, "full", str(writer.path), "k")(kept), ops.TENANT_IO, mine=False)


def test_embed_resources_come_from_config():
    from pipelines.staged_build import resources

    cfg = MemlibConfig()
    r = resources(cfg, total_cpus=2, n_blocks=10, n_tenants=5)
    # two single-thread embed actors, two session-local and two tenant actors on 2 CPUs, all placed at once
    assert (r.embed_actors, r.embed_cpus, r.embed_gpus, r.embed_threads, r.session_actors, r.tenant_actors) == \
        (2, 0.5, 0.0, 1, 2, 2)
    assert r.embed_actors * r.embed_cpus + r.session_actors * 0.25 + r.tenant_actors * 0.25 <= 2
    cfg.ray.embed_gpus, cfg.ray.embed_cpus, cfg.ray.embed_actors = 1.0, 0.5, 3
    r = resources(cfg, total_cpus=8, n_blocks=10)
    assert (r.embed_actors, r.embed_cpus, r.embed_gpus) == (3, 0.5, 1.0)
    assert resources(cfg, total_cpus=8, n_blocks=2).embed_actors == 2  # never more actors than blocks


def test_tenant_actors_follow_the_work_to_build():
    """One tenant actor per ``ray.tenant_actor_turns`` turns of the tenants to build, at least one,
    at most one per CPU and per tenant."""
    from pipelines.staged_build import resources

    cfg = MemlibConfig()
    per = cfg.ray.tenant_actor_turns
    assert resources(cfg, 2, n_blocks=1, n_tenants=3, tenant_turns=1500).tenant_actors == 1  # a small nightly
    assert resources(cfg, 8, n_blocks=40, n_tenants=3, tenant_turns=per + 1).tenant_actors == 2
    assert resources(cfg, 8, n_blocks=40, n_tenants=3, tenant_turns=50 * per).tenant_actors == 3  # per tenant
    assert resources(cfg, 2, n_blocks=40, n_tenants=30, tenant_turns=50 * per).tenant_actors == 2  # per CPU
    cfg.ray.tenant_actor_turns = 1
    assert resources(cfg, 2, n_blocks=1, n_tenants=3, tenant_turns=1500).tenant_actors == 2
    # many small tenants: an actor per ray.tenant_actor_tenants of them, never more than their rows
    cfg = MemlibConfig()
    many = 3 * cfg.ray.tenant_actor_tenants
    assert resources(cfg, 2, n_blocks=4, n_tenants=many, tenant_turns=5 * many, tenant_rows=4).tenant_actors == 2
    assert resources(cfg, 8, n_blocks=4, n_tenants=many, tenant_turns=5 * many, tenant_rows=2).tenant_actors == 2
    assert resources(cfg, 8, n_blocks=4, n_tenants=many, tenant_turns=5 * many, tenant_rows=9).tenant_actors == 3


FAKE_GPU_BUILD = """
import json, sys, ray
ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
from memlib.config import MemlibConfig
from jobs.build import run_build
cfg = MemlibConfig()
cfg.ray.embed_gpus = 1.0
m = run_build(cfg, sys.argv[1], "jsonl", sys.argv[2], num_cpus=2)
print("RESULT " + json.dumps(m["sessions"]))
"""


def test_embed_operator_runs_on_a_gpu_resource(tmp_path):
    """A local Ray started with a fake GPU: the embed actors are scheduled on it (Ray assigns them
    GPU 0) while the model still runs on the CPU."""
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(turn_lines()) + "\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-c", FAKE_GPU_BUILD, str(inp), str(tmp_path / "store")], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-3000:]
    stats = json.loads(line[0][7:])
    assert stats["embed_gpus"] == ["0"] and stats["sessions_computed"] == 5


def _lines(changes: dict[tuple[str, int], list[tuple[str, str, str]] | None], extra=()) -> list[str]:
    """The tiny input with sessions replaced (list) or deleted (None), plus extra sessions."""
    out = []
    sessions = {t: list(s) for t, s in SESSIONS.items()}
    for tenant, si, when, turns in extra:
        sessions[tenant].insert(si - 1, (when, turns))
    for tenant, ss in sessions.items():
        for si, (when, turns) in enumerate(ss, start=1):
            if (tenant, si) in changes:
                if changes[(tenant, si)] is None:
                    continue
                turns = changes[(tenant, si)]
            for ti, (role, speaker, text) in enumerate(turns, start=1):
                out.append(json.dumps({"tenant_id": tenant, "conversation_id": f"{tenant}-c", "session_id": f"s{si}",
                                       "session_time": when, "turn_id": f"s{si}:{ti}", "speaker": speaker,
                                       "role": role, "text": text}))
    return out


def _build(inp: Path, store: Path, *extra: str) -> dict:
    res = run_cli(["build", "--input", str(inp), "--format", "jsonl", "--out", str(store), "--num-cpus", "2",
                   "--set", "ray.block_turns=7", *extra])
    assert res.exit_code == 0, res.output + repr(res.exception)
    return json.loads((store / "manifest.json").read_text())


def _published(store: Path):
    """Every published node with its vector, every edge with its weight."""
    r = StoreReader(store)
    nodes = pl.from_arrow(r.nodes(columns=["node_id", "tenant_id", "kind", "text", "session_id", "provenance",
                                           "embedding"]))
    edges = pl.from_arrow(r.table("edges").select(["src", "dst", "kind", "relation", "weight"]))
    return nodes.sort("node_id"), edges.sort(["src", "dst", "kind", "relation"])


NEW_BEN = ("2023-05-01T08:00:00+00:00", [("user", "Ben", "My sister Maud visits Glasgow in June to see the robots."),
                                         ("assistant", "Bot", "She will love Finnieston.")])
EDITED_ANA = [("user", "Ana", "I started training for the Porto marathon in November instead."),
              ("assistant", "Bot", "A full marathon, brave!")]


def test_nightly_reuses_unchanged_sessions_and_equals_a_full_build(ray_local, tmp_path):
    store = tmp_path / "store"
    v1 = tmp_path / "v1.jsonl"
    v1.write_text("\n".join(_lines({})) + "\n", encoding="utf-8")
    m1 = _build(v1, store, "--incremental")
    assert m1["sessions"]["sessions_computed"] == 5
    # nightly: ben gets a third session, ana's second session is edited, cara is unchanged
    v2 = tmp_path / "v2.jsonl"
    v2.write_text("\n".join(_lines({("ana", 2): EDITED_ANA}, extra=[("ben", 3, *NEW_BEN)])) + "\n", encoding="utf-8")
    m2 = _build(v2, store, "--incremental")
    assert m2["incremental"]["built"] == ["ana", "ben"] and m2["incremental"]["carried"] == ["cara"]
    # ana 2 + ben 3 sessions; only ana/s2 (edited) and ben/s3 (new) go through the session pass
    assert (m2["sessions"]["sessions"], m2["sessions"]["sessions_computed"]) == (5, 2)
    # ben only gained a session: his tenant steps started from his published build; ana's edit is
    # not an append, so hers ran over the whole tenant (memlib.compose.reuse)
    reused = m2["tenant_reused"]
    assert reused["ben"]["appended_only"] == 1 and reused["ben"]["appended_turns"] == 2
    assert reused["ben"]["node_vectors"] > 0 and reused["ana"] == {"appended_only": 0}
    # and his facts and triplets steps copied the published rows of his first sessions (decision 0035)
    assert reused["ben"]["facts_rows_copied"] > 0 and reused["ben"]["triplets_rows_copied"] > 0
    full = tmp_path / "full"
    _build(v2, full, "--set", "ray.tenant_batch_turns=1")  # each tenant in a row and a part of its own
    got, want = _published(store), _published(full)
    assert got[0].equals(want[0]) and got[1].equals(want[1])
    # the nightly store's tiny tenants share rows and parts: cara was carried out of the part it
    # shared with the rebuilt ana and ben into a part of its own; the full build has a part per tenant
    parts = StoreReader(store).parts()
    assert len(parts) == 2 and sorted(map(sorted, parts.values())) == [["ana", "ben"], ["cara"]]
    assert len(StoreReader(full).parts()) == 3
    fallbacks = lambda s: pl.from_arrow(StoreReader(s).table("node_fallbacks")).sort("node_id")  # noqa: E731
    assert fallbacks(store).equals(fallbacks(full)) and len(fallbacks(store))
    refs = lambda s: pl.from_arrow(StoreReader(s).table("matrix_refs")).sort("tenant_id")  # noqa: E731
    assert refs(store).equals(refs(full)) and refs(store)["tenant_id"].to_list() == ["ana", "ben", "cara"]
    sums = lambda s: pl.from_arrow(StoreReader(s).table("token_sums")).sort(["tenant_id", "id"])  # noqa: E731
    assert sums(store).equals(sums(full)) and set(sums(store)["tenant_id"]) == {"ana", "ben", "cara"}
    texts = " ".join(got[0]["text"].to_list())
    assert "Porto marathon" in texts and "Lisbon half marathon" not in texts and "Maud" in texts
    # a deleted session disappears with everything derived from it
    v3 = tmp_path / "v3.jsonl"
    v3.write_text("\n".join(_lines({("ana", 1): None}, extra=[("ben", 3, *NEW_BEN)])) + "\n", encoding="utf-8")
    m3 = _build(v3, store, "--incremental")
    assert m3["incremental"]["built"] == ["ana"]
    nodes, _ = _published(store)
    ana = nodes.filter(pl.col("tenant_id") == "ana")
    assert not any(w in " ".join(ana["text"].to_list()) for w in ("Pixel", "kitten", "Rita", "feather"))
    gone = {n for n in pl.from_arrow(StoreReader(store).table("turns", "ana"))["node_id"].to_list()}
    assert all(set(p) <= gone for p in ana["provenance"].to_list())


def test_a_failing_tenant_is_reported_with_its_reason(tmp_path):
    """The tenant operator turns one tenant's exception into that tenant's summary (type, message
    and the memlib frame that raised), so the build reports why it failed and builds the others;
    a tenant whose block failed in a session operator is reported with that block's reason."""
    from pipelines import operators as ops
    from pipelines.tenant_op import TenantOp, tenant_item

    cfg = MemlibConfig()
    writer, shards = _shards(tmp_path, cfg)
    broken, other = replace(shards[0], turns_path=str(tmp_path / "gone.parquet")), shards[1]  # its input vanished
    op = TenantOp(cfg, "turns", str(writer.path), "key")
    # a block that failed upstream: its failure marker names the reason, the tenant does not wait
    item = {"block_id": "b1", "work": str(tmp_path / "work")}
    ops.mark_failed(item, "embed", ValueError("the encoder could not read this"))
    # both tenants in one row, as small tenants travel: each gets its own summary and reason
    row = {"kind": "tenant", "item": json.dumps([tenant_item(broken, [], tmp_path / "work", []),
                                                 tenant_item(other, ["b1"], tmp_path / "work", [])]),
           "turns": None, "vectors": None, "summary": None}
    summary, second = json.loads(op(ops.batch_of([row])).column("summary")[0].as_py())
    assert summary["tenant_id"] == broken.tenant_id
    assert "error" in summary and ("FileNotFoundError" in summary["error"] or "ArrowInvalid" in summary["error"]
                                   or "OSError" in summary["error"]), summary
    assert broken.turns_path.split("/")[-1] in summary["error"] or "No such file" in summary["error"], summary
    summary = second
    assert summary["tenant_id"] == other.tenant_id and "block b1" in summary["error"], summary
    assert "the encoder could not read this" in summary["error"]


def test_a_tenant_reads_its_earlier_sessions_before_its_blocks_are_kept(ray_local, tmp_path):
    """The tenant operator reads the sessions kept by earlier runs at once and the sessions of this
    run's blocks once those are kept: every session arrives, the earlier ones first, none twice."""
    import threading
    import time

    from memlib.compose.sessions import session_keys, sort_turns
    from pipelines import operators as ops
    from pipelines.shard import staged_rows
    from pipelines.staged_build import plan_sessions
    from pipelines.tenant_op import TenantOp

    cfg = MemlibConfig()
    writer, shards = _shards(tmp_path, cfg)
    store = SessionStore(writer.path, "k", cfg.embed.dim)
    plan = plan_sessions(shards, store, "k", tmp_path / "work" / "blocks", block_turns=7)
    embed, local = ops.EmbedOp(cfg, threads=1), ops.SessionLocalOp(cfg, "full", str(writer.path), "k")

    def keep(path: str) -> None:
        block = ops.batch_of([{"kind": "block", "item": ops.block_item(path), "turns": None, "vectors": None,
                               "summary": None}])
        local(embed(ops.turn_nodes_op(block, cfg)))

    tenant = next(s for s in shards if len(plan.tenant_blocks[s.tenant_id]) > 1)
    late_block = plan.tenant_blocks[tenant.tenant_id][-1]
    late_path = next(p for p in plan.blocks if Path(p).stem == late_block)
    for path in plan.blocks:
        if path != late_path:
            keep(path)
    late_keys = set(pq.read_table(late_path).column("session_key").to_pylist())
    op = TenantOp(cfg, "full", str(writer.path), "k")
    calls: list[tuple[float, set[str]]] = []
    read = op.sessions.read
    op.sessions.read = lambda keys, blocks=None: (calls.append((time.perf_counter(), set(keys))), read(keys, blocks))[1]
    turns = staged_rows(tenant.turns_path, tenant.tenant_id)
    order = list(dict.fromkeys(session_keys(sort_turns(turns), "k").to_pylist()))
    later = threading.Timer(0.6, keep, args=(late_path,))
    started = time.perf_counter()
    later.start()
    outputs, vectors, waited = op.read_sessions(order, [late_block], tmp_path / "work", late_keys & set(order))
    later.join()
    assert waited >= 0.3
    assert [keys for _, keys in calls] == [set(order) - late_keys, set(order) & late_keys]
    assert calls[0][0] - started < 0.3  # the earlier sessions were read before the late block was kept
    got = set(outputs.table("nodes").column("session_key").to_pylist())
    assert got == set(order) and len(vectors.node_ids) == len(set(vectors.node_ids))


WORKER_ENV_START = """
import json, os, sys, ray
from jobs.build import init_ray
from pipelines.operators import WORKER_ENV
target = init_ray(None, 2, token_auth=False)

@ray.remote(num_cpus=0.25)
def worker_side():
    from memlib.compose.sessions import prepare
    from memlib.compose.recipe import get_recipe
    from memlib.config import MemlibConfig
    prepare(MemlibConfig(), get_recipe("full"))  # loads the heuristic extractors and spaCy
    return {k: os.environ.get(k) for k in WORKER_ENV}, "openai" in sys.modules

env, openai_loaded = ray.get(worker_side.remote())
print("RESULT " + json.dumps({"inherited": target.worker_env_inherited, "worker_env": env,
                              "driver_env": {k: os.environ.get(k) for k in WORKER_ENV},
                              "openai_loaded": openai_loaded}))
"""


def _run_driver(script: str) -> dict:
    """Run ``script`` as a driver process of its own (without the operators' variables in its
    environment); returns the JSON it printed after ``RESULT``."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and k not in
           ("POLARS_MAX_THREADS", "TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS")}
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(line[0][7:])


JOB_ENV_START = """
import json, os, ray
from jobs.build import init_ray
from jobs.local_ray import workers_inherit
from pipelines.operators import WORKER_ENV
first = dict(list(WORKER_ENV.items())[:-1])
ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": first})
partial = workers_inherit(WORKER_ENV)
ray.shutdown()
ray.init(address="local", num_cpus=2, include_dashboard=False,
         runtime_env={"env_vars": {**WORKER_ENV, "HF_HUB_OFFLINE": "1"}})
target = init_ray(None, 2)  # joins the instance running (a job on a cluster, as ray job submit runs it)

@ray.remote(num_cpus=0.25)
def worker_side():
    return {k: os.environ.get(k) for k in WORKER_ENV}

print("RESULT " + json.dumps({"partial": partial, "inherited": target.worker_env_inherited,
                              "worker_env": ray.get(worker_side.remote())}))
"""


def test_a_job_whose_runtime_env_sets_the_operator_environment_needs_none_per_operator(tmp_path):
    """A job started with the operators' environment in its runtime_env (``ray job submit``, the
    RayJob manifest) counts as inherited, so the operators ask for no runtime_env of their own;
    a job missing one of the variables does not."""
    out = _run_driver(JOB_ENV_START)
    from pipelines.operators import WORKER_ENV

    assert out["partial"] is False
    assert out["inherited"] is True and out["worker_env"] == WORKER_ENV


def test_a_local_ray_started_by_the_build_gives_its_workers_the_operator_environment(tmp_path):
    """The local instance the build starts passes the operators' environment to every worker (no
    per-operator runtime_env, which would make Ray start new workers), while the driver keeps its
    own; a heuristic build's workers never import the LLM client."""
    out = _run_driver(WORKER_ENV_START)
    from pipelines.operators import WORKER_ENV

    assert out["inherited"] and out["worker_env"] == WORKER_ENV
    assert all(v is None for v in out["driver_env"].values())
    assert out["openai_loaded"] is False


STOP_LOCAL = """
import json, ray
from ray._private import worker
from jobs.local_ray import start_local, stop_local
ray.init(address="local", num_cpus=1, include_dashboard=False)
other = stop_local()  # an instance this process did not start through start_local: left up
other_up = ray.is_initialized()
ray.shutdown()
start_local(1, token_auth=False)
monitor = worker._global_node.all_processes["monitor"][0].process
stopped = stop_local()
print("RESULT " + json.dumps({"other": other, "other_up": other_up, "stopped": stopped, "up": ray.is_initialized(),
                              "monitor_exit": monitor.poll(), "again": stop_local()}))
"""


def test_stop_local_stops_only_the_instance_this_process_started():
    """The build stops the local Ray it started (its idle autoscaler monitor killed rather than
    waited for); an instance it joined, or one started otherwise, is left alone."""
    out = _run_driver(STOP_LOCAL)
    assert out["other"] is False and out["other_up"] is True
    assert out["stopped"] is True and out["up"] is False and out["monitor_exit"] is not None
    assert out["again"] is False


def test_small_tenants_travel_together_and_large_ones_alone():
    """pack_tenants: a tenant of batch_turns turns or more has a row of its own; smaller ones share
    rows of at most batch_turns turns, in the given order, each tenant in exactly one row."""
    from pipelines.shard import TenantShard
    from pipelines.tenant_op import pack_tenants

    sizes = [900, 512, 300, 200, 100, 5, 5, 5, 400, 3]
    shards = [TenantShard(f"t{i}", "", "", n) for i, n in enumerate(sizes)]
    rows = pack_tenants(shards, 512)
    assert [[s.tenant_id for s in r] for r in rows] == [
        ["t0"], ["t1"], ["t2", "t3"], ["t4", "t5", "t6", "t7"], ["t8", "t9"]]
    assert sorted(s.tenant_id for r in rows for s in r) == sorted(s.tenant_id for s in shards)
    assert all(sum(s.turns for s in r) <= 512 or len(r) == 1 for r in rows)
    assert pack_tenants([], 512) == []


def test_a_row_whose_part_cannot_be_written_fails_its_tenants_by_name(tmp_path, monkeypatch):
    """Writing a row's part is the last step of its tenants: when it raises (a full disk, an
    unknown table), each of the row's tenants gets that reason in its summary, and the operator
    returns normally, so the other rows of the build go on."""
    from pipelines import operators as ops
    from pipelines import tenant_op
    from pipelines.tenant_op import TenantOp, tenant_item

    cfg = MemlibConfig()
    writer, shards = _shards(tmp_path, cfg)
    op = TenantOp(cfg, "turns", str(writer.path), "key")
    monkeypatch.setattr(op, "build_one", lambda shard, *a: ({"tenant_id": shard.tenant_id}, {}))

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tenant_op, "write_part", full_disk)
    row = {"kind": "tenant", "item": json.dumps([tenant_item(s, [], tmp_path / "work", []) for s in shards[:2]]),
           "turns": None, "vectors": None, "summary": None}
    summaries = json.loads(op(ops.batch_of([row])).column("summary")[0].as_py())
    assert [s["tenant_id"] for s in summaries] == [s.tenant_id for s in shards[:2]]
    assert all("part could not be written" in s["error"] and "No space left" in s["error"] for s in summaries)
