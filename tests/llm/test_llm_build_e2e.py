"""End to end: `memlib build --extractor llm` against the fake OpenAI-compatible server over HTTP.

One shared sequence of builds into one store (module fixture ``runs``):
  v1  20 % injected faults, no retries  -> fallbacks + status=error rows
  v2  healthy server                     -> only the failed units (and follow-ups whose input changed) are called
  v3  healthy server, unchanged input    -> 0 HTTP requests (cache under STORE/cache/llm)
plus `--dry-run` on the same input, compared with the tokens the real build counted.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from memlib.llm.fake_server import FakeLLMServer

pytestmark = pytest.mark.ray

SAMPLE = Path(__file__).resolve().parents[2] / "memlib" / "data" / "sample_conversations.jsonl"
UNIT_TASKS = ("facts", "triplets", "events")          # one call per unit of turns
FOLLOW_UPS = ("outdated", "causal", "reflections")    # calls whose input is other calls' output
STAGE_KINDS = {"facts": ("fact", "concept"), "triplets": ("triplet", "entity"), "events": ("event",)}
FAULT_WORDS = ("timeout", "429", "500", "invalid JSON", "truncated", "schema")


def _args(store: Path, url: str, *extra: str) -> list[str]:
    sets = {"llm.base_url": url, "llm.max_retries": "0", "llm.timeout_s": "2", "llm.backoff_base_s": "0.01",
            "llm.backoff_max_s": "0.05", "llm.requests_per_minute": "100000", "llm.api_key": "sk-test-secret",
            "embed.backend": "wordllama", "embed.dim": "256"}
    out = ["build", "--input", str(SAMPLE), "--format", "jsonl", "--out", str(store), "--num-cpus", "2",
           "--extractor", "llm", *extra]
    for k, v in sets.items():
        out += ["--set", f"{k}={v}"]
    return out


def _invoke(args: list[str]):
    from typer.testing import CliRunner

    from jobs.cli import app

    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output[-3000:] + str(res.exception)[-4000:]
    return res


def _build(store: Path, **server) -> dict:
    with FakeLLMServer(**server) as srv:
        res = _invoke(_args(store, srv.url))
        return {"output": res.output, "requests": srv.state.chat_requests,
                "injected": [f.value for f in srv.state.injected]}


def _calls(store: Path, version: str) -> pl.DataFrame:
    return pl.read_parquet(str(store / "versions" / version / "llm_calls" / "*.parquet"))


@pytest.fixture(scope="module")
def runs(ray_local, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("llm_build")
    store = root / "store"
    out = {"store": store}
    out["v1"] = _build(store, fault_rate=0.2, seed=3, delay_s=2.5)
    out["v2"] = _build(store)
    out["v3"] = _build(store)
    with FakeLLMServer() as srv:
        dry = _invoke(_args(root / "dry_store", srv.url, "--dry-run"))
        out["dry"] = {"output": dry.output, "requests": srv.state.chat_requests, "store": root / "dry_store"}
    return out


def _nodes(store: Path, version_manifest: str) -> pl.DataFrame:
    from memlib.io.store import StoreReader

    manifest = json.loads((store / "manifests" / f"{version_manifest}.json").read_text())
    reader = StoreReader(store, manifest=manifest)
    return pl.from_arrow(reader.nodes(columns=["node_id", "tenant_id", "kind", "session_id", "source",
                                               "prompt_version", "provenance"]))


def test_faulty_build_records_every_failure(runs):
    store, v1 = runs["store"], runs["v1"]
    assert len(v1["injected"]) >= 5, "the fault injection did not fire"
    calls = _calls(store, "v000001")
    # every HTTP request the server saw is an attempt of exactly one recorded call
    assert int(calls["attempts"].sum()) == v1["requests"]
    errors = calls.filter(pl.col("status") == "error")
    assert errors.height > 0
    assert errors["error"].null_count() == 0
    assert all(any(w in e for w in FAULT_WORDS) for e in errors["error"].to_list())
    assert set(calls["status"].unique()) <= {"ok", "error"}  # a fresh cache: nothing cached yet
    manifest = json.loads((store / "manifests" / "v000001.json").read_text())
    assert manifest["llm_calls"]["error"] == errors.height
    assert manifest["llm_calls"]["calls"] == calls.height
    assert "llm calls" in v1["output"]


def _failed_unit_turns(store: Path, version: str, failed: set[tuple[str, str]]) -> dict[tuple[str, str], list]:
    """(task, unit_id) -> the unit's turn node ids, recomputed from the stored turns as the build made them."""
    from memlib.config import MemlibConfig
    from memlib.extract.base import ExtractionContext
    from memlib.extract.llm_common import make_units
    from memlib.llm.models import Task
    from memlib.text.gate import gate_flags

    turns = pq.read_table(store / "versions" / version / "turns")
    cfg = MemlibConfig()
    kept = frozenset(turns.filter(gate_flags(turns, cfg.gate)).column("node_id").to_pylist())
    kept_turns = ExtractionContext(turns=turns, kept_turn_ids=kept, config=cfg).kept_turns()
    out = {}
    for task in UNIT_TASKS:
        for u in make_units(kept_turns, cfg.llm.turns_per_call, Task(task)):
            if (task, u.unit_id) in failed:
                out[(task, u.unit_id)] = list(u.turn_node_ids)
    return out


@pytest.mark.parametrize("stage", UNIT_TASKS)
def test_no_unit_lost_fallback_rows(runs, stage):
    """Every row the heuristic backend extracts from a failed unit's turns is in the store."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from memlib.config import Backend, MemlibConfig
    from memlib.extract.base import ExtractionContext, get_extractor

    store = runs["store"]
    calls = _calls(store, "v000001")
    failed = set(calls.filter((pl.col("status") == "error") & pl.col("task").is_in(UNIT_TASKS))
                 .select("task", "unit_id").iter_rows())
    assert failed, "no unit-level call failed; raise the fault rate or change the seed"
    units = _failed_unit_turns(store, "v000001", failed)
    assert set(units) == failed
    nodes = _nodes(store, "v000001")
    assert nodes.filter(pl.col("source") == "heuristic-fallback").height > 0
    stored = set(nodes["node_id"])
    turns = pq.read_table(store / "versions" / "v000001" / "turns")
    for (task, _), ids in units.items():
        if task != stage:
            continue
        sub = turns.filter(pc.is_in(turns.column("node_id"), value_set=pa.array(ids)))
        ctx = ExtractionContext(turns=sub, config=MemlibConfig())
        expect = set(get_extractor(task, Backend.HEURISTIC).run(ctx).nodes.column("node_id").to_pylist())
        assert expect <= stored, f"{task}: {len(expect - stored)} fallback rows of a failed unit are missing"
    fb = nodes.filter(pl.col("source") == "heuristic-fallback")
    # model rows carry the prompt hash of their task
    from memlib.llm.models import Task
    from memlib.llm.prompts import load_prompts

    hashes = {p.prompt_version for p in load_prompts().values()}
    model_rows = nodes.filter(pl.col("source") == "gpt-4o-mini")
    assert model_rows.height > 0
    assert set(model_rows["prompt_version"].unique()) <= hashes
    assert load_prompts()[Task.FACTS].prompt_version in set(model_rows["prompt_version"])
    assert fb["prompt_version"].null_count() == fb.height


def test_rerun_fills_exactly_the_failed_units(runs):
    store, v2 = runs["store"], runs["v2"]
    c1, c2 = _calls(store, "v000001"), _calls(store, "v000002")
    failed = set(c1.filter((pl.col("status") == "error") & pl.col("task").is_in(UNIT_TASKS))
                 .select("task", "unit_id").iter_rows())
    sent = set(c2.filter((pl.col("status") == "ok") & pl.col("task").is_in(UNIT_TASKS))
               .select("task", "unit_id").iter_rows())
    assert sent == failed
    # a call answered in v1 is a cache hit in v2; every v2 request is a call v1 did not complete
    ok1 = set(c1.filter(pl.col("status") == "ok")["cache_key"])
    assert c2.filter(pl.col("cache_key").is_in(list(ok1)))["status"].unique().to_list() == ["cached"]
    assert c2.filter(pl.col("status") == "error").height == 0
    follow = c2.filter((pl.col("status") == "ok") & pl.col("task").is_in(FOLLOW_UPS)).height
    assert v2["requests"] == len(failed) + follow == c2.filter(pl.col("status") == "ok").height
    nodes = _nodes(store, "v000002")
    assert nodes.filter(pl.col("source") == "heuristic-fallback").height == 0


def test_unchanged_rerun_caches_every_unit_and_follow_up_but_causal(runs):
    c3 = _calls(runs["store"], "v000003")
    assert c3.filter(pl.col("task") != "causal")["status"].unique().to_list() == ["cached"]
    assert runs["v3"]["requests"] == c3.filter(pl.col("status") == "ok").height


def test_unchanged_rerun_makes_no_request(runs):
    store, v3 = runs["store"], runs["v3"]
    assert v3["requests"] == 0
    c3 = _calls(store, "v000003")
    assert c3.height > 0 and c3["status"].unique().to_list() == ["cached"]
    assert int(c3["prompt_tokens"].sum()) == 0
    assert (store / "cache" / "llm").is_dir()


def _dry_totals(output: str) -> tuple[int, int, int]:
    m = re.search(r"^\s+total\s+(\d+)\s+(\d+)\s+(\d+)", output, re.MULTILINE)
    assert m, output
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def test_dry_run_estimate_within_20_percent(runs):
    store, dry = runs["store"], runs["dry"]
    assert dry["requests"] == 0 and not dry["store"].exists()
    assert "est. cost $" in dry["output"]
    calls, est_in, est_out = _dry_totals(dry["output"])
    # the tokens of a complete build: usage stored with every response the final version used
    keys = _calls(store, "v000003")["cache_key"].to_list()
    usage = [json.loads((store / "cache" / "llm" / k[:2] / f"{k}.json").read_text())["usage"] for k in keys]
    real_in = sum(u["prompt_tokens"] for u in usage)
    real_out = sum(u["completion_tokens"] for u in usage)
    err = (est_in + est_out) / (real_in + real_out) - 1
    print(f"dry run: {calls} calls, {est_in} in, {est_out} out; real: {len(keys)} calls, {real_in} in, "
          f"{real_out} out; total error {err:+.1%}")
    assert abs(err) <= 0.20
    assert abs(calls / len(keys) - 1) <= 0.20


def _bytes_contain(root: Path, needle: bytes) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_forget_then_compact_purges_the_llm_cache(runs, tmp_path):
    """Hard deletion reaches the response cache: after forgetting a tenant and compacting, no
    cached response quotes it, the entries the published llm_calls reference are kept, and
    auto's token matrices are gone (re-derived on first use) but for the matrix references of
    the published tenants."""
    import shutil

    store = tmp_path / "store"
    shutil.copytree(runs["store"], store)
    needle = b"system design interview"
    assert any(p.startswith("cache/llm/") for p in _bytes_contain(store, needle))  # the fake quotes turns
    (store / "cache" / "late").mkdir(parents=True, exist_ok=True)
    (store / "cache" / "late" / "late-raj-00000000000000000000.npz").write_bytes(b"vectors")
    forget = tmp_path / "forget.txt"
    forget.write_text("raj\n")
    with FakeLLMServer() as srv:
        _invoke(_args(store, srv.url, "--incremental", "--delete", str(forget)))
        assert srv.state.chat_requests == 0  # the other tenants are carried over
    res = _invoke(["build", "--out", str(store), "--compact"])
    removed = re.search(r"llm cache removed (\d+)", res.output)
    assert removed and int(removed.group(1)) > 0, res.output
    assert _bytes_contain(store, needle) == []
    published = json.loads((store / "manifest.json").read_text())["version"]
    keys = set(_calls(store, published).get_column("cache_key").drop_nulls().to_list())
    cached = {p.stem for p in (store / "cache" / "llm").glob("*/*.json")}
    assert cached and cached <= keys
    left = sorted((store / "cache" / "late").glob("*")) if (store / "cache" / "late").exists() else []
    tenants = set(json.loads((store / "manifest.json").read_text())["tenants"])
    assert "raj" not in tenants and left == [], left  # matrices encoded at query time are text-derived: gone
    with FakeLLMServer() as srv:  # what is left still serves an unchanged rerun: no request
        _invoke(_args(store, srv.url, "--incremental", "--delete", str(forget)))
        assert srv.state.chat_requests == 0
