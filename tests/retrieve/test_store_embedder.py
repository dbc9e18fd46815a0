"""Queries are embedded by the model that embedded the store's nodes, whatever the config's
default: eval, query, serve (and a served store rebuilt with another embedder)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from jobs.cli import app
from memlib.config import MemlibConfig, load_config
from memlib.embed import get_embedder
from memlib.embed.base import EmbedError
from memlib.embed.space import built_space, store_embed_config
from memlib.eval.runner import default_embedder, evaluate
from memlib.io.store import StoreReader, read_manifest
from tests.retrieve.conftest import EMBED_SETS, SAMPLE, retrieve_config

pytestmark = pytest.mark.ray


def test_store_records_its_vector_space(sample_store):
    assert built_space(read_manifest(sample_store)) == {"backend": "wordllama", "dim": 256}
    assert built_space({"config": {}}) is None and built_space(None) is None
    # an openai store's space includes its model and prefixes; the runtime endpoint is not part of it
    space = built_space({"config": {"embed": {"backend": "openai", "model": "m1", "dim": 8, "query_prefix": "q: ",
                                              "passage_prefix": "p: ", "base_url": "http://old:1/v1"}}})
    assert space == {"backend": "openai", "model": "m1", "dim": 8, "query_prefix": "q: ", "passage_prefix": "p: "}


def test_default_config_queries_a_store_with_the_stores_model(sample_store):
    cfg = MemlibConfig()  # default backend minilm-tokens, 384-d; the store is wordllama, 256-d
    emb = default_embedder(cfg, sample_store)
    assert (emb.embed_cfg.backend, emb.embed_cfg.dim) == ("wordllama", 256)
    assert emb.embed_cfg.threads == cfg.embed.threads  # runtime settings stay the config's
    questions = StoreReader(sample_store).table("questions")
    got = evaluate(sample_store, questions, ["dense"], [5, 10], cfg)
    ref = evaluate(sample_store, questions, ["dense"], [5, 10], retrieve_config())
    assert got.metrics["strategies"]["dense"]["turn_recall@10"] == ref.metrics["strategies"]["dense"]["turn_recall@10"]
    assert got.per_question["ranked_turn_ids"].to_list() == ref.per_question["ranked_turn_ids"].to_list()


def test_eval_of_a_store_alone_scores_its_own_questions(sample_store, tmp_path):
    # no --input and no --format: the store's questions table, by the rules of the format it was
    # built from (jsonl here: generic); the locomo default crashed on it
    res = CliRunner().invoke(app, ["eval", "--store", str(sample_store), "--strategies", "bm25,dense",
                                   "--out", str(tmp_path / "ev")])
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "| bm25 |" in res.output and "| dense |" in res.output
    assert (tmp_path / "ev" / "metrics.json").exists()


def test_a_config_contradicting_the_store_is_an_error(sample_store):
    cfg = load_config(None, ["embed.backend=minilm"])
    with pytest.raises(EmbedError, match=r"built with embed.backend='wordllama'.*config sets embed.backend='minilm'"):
        default_embedder(cfg, sample_store)
    # the same setting as the store's is fine, and a runtime setting never clashes
    assert store_embed_config(load_config(None, ["embed.backend=wordllama", "embed.threads=1"]).embed,
                              read_manifest(sample_store)).threads == 1
    res = CliRunner().invoke(app, ["query", "where did Maya move?", "--store", str(sample_store), "--tenant", "maya",
                                   "--strategy", "dense", "--set", "embed.backend=minilm"])
    assert res.exit_code != 0 and "built with embed.backend='wordllama'" in res.output


def test_serve_follows_a_rebuild_in_another_vector_space(sample_store, tmp_path):
    from memlib.serve.service import SearchService

    store = tmp_path / "store"
    shutil.copytree(sample_store, store)
    follows = SearchService(store, MemlibConfig())
    pinned = SearchService(store, load_config(None, ["embed.backend=wordllama"]))
    assert follows.cache.embedder.dim == 256 and pinned.cache.embedder.dim == 256
    before = follows.cache.version
    # rebuild in the default space (minilm-tokens, 384-d), named: a new version of the same store
    res = CliRunner().invoke(app, ["build", "--input", str(SAMPLE), "--format", "jsonl", "--out", str(store),
                                   "--num-cpus", "2", "--set", "embed.backend=minilm-tokens"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert built_space(read_manifest(store)) == {"backend": "minilm-tokens", "dim": 384}

    assert follows.refresh() and follows.cache.version != before
    assert follows.cache.embedder.dim == 384
    tenant = follows.cache.tenants()[0]
    idx = follows.cache.get(tenant)
    want = get_embedder(MemlibConfig().embed).embed_queries(["where did Maya move?"])[0]
    assert np.allclose(idx.embed_query("where did Maya move?"), want, atol=1e-6)
    assert follows.cache.get(tenant).embeddings.shape[1] == 384

    # a service whose config names the old embedder keeps the version it can serve
    assert not pinned.refresh() and pinned.cache.version == before

    # a nightly run in another space whose input lacks a published tenant would leave that tenant's
    # vectors in the old space: refused before anything is built, nothing published
    published = read_manifest(store)["version"]
    part = tmp_path / "part.jsonl"  # maya's turns only
    part.write_text("".join(x for x in SAMPLE.read_text(encoding="utf-8").splitlines(keepends=True)
                            if x.startswith('{"tenant_id": "maya"')), encoding="utf-8")
    res = CliRunner().invoke(app, ["build", "--input", str(part), "--format", "jsonl", "--out", str(store),
                                   "--num-cpus", "2", "--incremental", "--set", "embed.backend=wordllama"])
    assert res.exit_code != 0 and "cannot mix the vectors of two models" in res.output
    assert "embed.backend='minilm-tokens'" in res.output and "embed.backend='wordllama'" in res.output
    assert read_manifest(store)["version"] == published


def test_a_build_naming_no_embedder_keeps_the_stores(sample_store, tmp_path):
    """A nightly run need not repeat the embedder a store was built with, and never switches it by
    omission (the query side follows the same rule)."""
    store = tmp_path / "store"
    shutil.copytree(sample_store, store)
    before = read_manifest(store)
    args = ["build", "--input", str(SAMPLE), "--format", "jsonl", "--out", str(store), "--num-cpus", "2",
            "--incremental"]
    res = CliRunner().invoke(app, [*args, "--set", "retrieve.precompute_token_matrices=true"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "embed: wordllama, the embedder" in res.output
    after = read_manifest(store)
    assert built_space(after) == built_space(before) == {"backend": "wordllama", "dim": 256}
    assert after["build_key"] == before["build_key"]
    assert "built 0" in res.output  # same input, same key: every tenant carried, nothing recomputed
    # named, another embedder is a switch: every tenant of the input rebuilt in it
    res = CliRunner().invoke(app, [*args, "--set", "embed.backend=minilm-tokens"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "embed: wordllama" not in res.output
    assert built_space(read_manifest(store)) == {"backend": "minilm-tokens", "dim": 384}


def _facts(store, tenant, kind="fact"):
    nodes = StoreReader(store).nodes(tenant)
    facts = nodes.filter(pc.equal(nodes.column("kind"), kind))
    emb = facts.column("embedding").combine_chunks()
    return facts.column("text").to_pylist(), emb.values.to_numpy().reshape(-1, emb.type.list_size)


def test_facts_get_their_own_vectors_with_another_backend(sample_store, tmp_path):
    from memlib.compose.vectors import own_pass_kinds

    assert own_pass_kinds(MemlibConfig()) == ("fact",)  # the default sums a fact's pooled and own vectors
    assert own_pass_kinds(retrieve_config()) == ("fact", "clue")
    wordllama = get_embedder(retrieve_config().embed)
    manifest = read_manifest(sample_store)
    tenant = "maya"
    texts, vecs = _facts(sample_store, tenant)
    assert texts and np.allclose(vecs, wordllama.embed_passages(texts), atol=1e-5)
    # a clue of one session keeps its own text's vector (a merged clue: the mean of its members')
    clues, clue_vecs = _facts(sample_store, tenant, "clue")
    sessions = StoreReader(sample_store).nodes(tenant).column("kind").to_pylist().count("session")
    assert clues and len(clues) == sessions  # no clue of the sample is merged
    assert np.allclose(clue_vecs, wordllama.embed_passages(clues), atol=1e-5)
    assert manifest["tenants"][tenant]["own_encoded"] == len(texts) + len(clues)

    # a nightly run that appends a session encodes only the facts it did not publish before
    store = tmp_path / "store"
    shutil.copytree(sample_store, store)
    more = tmp_path / "more.jsonl"
    new = [{"tenant_id": tenant, "conversation_id": "maya-main", "session_id": "s99",
            "session_time": "2025-03-01T10:00:00+00:00", "turn_id": f"s99:{i}", "speaker": "Maya", "role": "user",
            "text": text} for i, text in enumerate(["I adopted a grey cat called Pixel last Sunday.",
                                                    "My sister Ana moved to Porto in February."], 1)]
    more.write_text(SAMPLE.read_text(encoding="utf-8") + "".join(json.dumps(r) + "\n" for r in new), encoding="utf-8")
    res = CliRunner().invoke(app, ["build", "--input", str(more), "--format", "jsonl", "--out", str(store),
                                   "--num-cpus", "2", "--incremental", *EMBED_SETS])
    assert res.exit_code == 0, res.output + repr(res.exception)
    after = read_manifest(store)["tenants"][tenant]
    texts2, vecs2 = _facts(store, tenant)
    assert len(texts2) > len(texts)
    # the new session's facts and clue (+ merged ones)
    assert 0 < after["own_encoded"] <= len(texts2) - len(texts) + 1 + 2
    assert np.allclose(vecs2, wordllama.embed_passages(texts2), atol=1e-5)


def test_fit_assomem_fits_on_every_tenant_with_questions_by_default(sample_store, tmp_path):
    import polars as pl

    from memlib.eval.questions import Dataset, read_questions

    asked = sorted(pl.from_arrow(read_questions(SAMPLE, Dataset("jsonl"), retrieve_config()))["tenant_id"].unique())
    assert len(asked) >= 2
    for extra, tenants in (([], asked), (["--tenants", asked[0]], asked[:1])):
        out = tmp_path / f"w{len(tenants)}.json"
        res = CliRunner().invoke(app, ["fit-assomem", "--store", str(sample_store), "--input", str(SAMPLE),
                                       "--format", "jsonl", "--out", str(out), *extra])
        assert res.exit_code == 0, res.output + repr(res.exception)
        fitted = json.loads(out.read_text(encoding="utf-8"))
        assert fitted["tenants"] == tenants and fitted["types"]
        for v in fitted["types"].values():
            assert abs(sum(v["weights"].values()) - 1.0) < 1e-9
