"""openai backend through the real openai client against a tiny local HTTP server."""
from __future__ import annotations

import hashlib
import json
import threading
import time

import numpy as np
import pytest

from memlib.config import EmbedConfig
from memlib.embed import EmbedError, get_embedder
from tests.conftest import JsonHandler, serving

SERVER_DIM = 8
SECRET = "sk-test-secret-123"


def fake_vector(text: str, dim: int = SERVER_DIM) -> list[float]:
    """Deterministic, unnormalized vector derived from the text."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return [b - 127.5 for b in digest[:dim]]


class _Handler(JsonHandler):
    requests: list[dict] = []
    protocol_version = "HTTP/1.1"
    in_flight = 0
    most_in_flight = 0
    lock = threading.Lock()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        cls.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        with cls.lock:
            cls.in_flight += 1
            cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
        try:
            if body.get("model") == "slow-embed":  # long enough for requests to overlap
                time.sleep(0.05)
            self._answer(body)
        finally:
            with cls.lock:
                cls.in_flight -= 1

    def _answer(self, body: dict) -> None:
        if self.path != "/v1/embeddings":
            return self.send_json(404, {"error": {"message": "not found"}})
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": fake_vector(t)} for i, t in enumerate(inputs)]
        data.reverse()  # the client must order by index, not by position
        self.send_json(200, {"object": "list", "data": data, "model": body["model"],
                         "usage": {"prompt_tokens": 1, "total_tokens": 1}})


@pytest.fixture(scope="module")
def server_url():
    with serving(_Handler) as url:
        yield url


def _cfg(url: str, **kw) -> EmbedConfig:
    base = dict(backend="openai", base_url=url, api_key=SECRET, model="fake-embed", dim=SERVER_DIM,
                batch_size=2, query_prefix="query: ", passage_prefix="passage: ")
    return EmbedConfig(**(base | kw))


def test_embed_openai_vectors_prefixes_and_batches(server_url):
    _Handler.requests.clear()
    embedder = get_embedder(_cfg(server_url))
    texts = ["alpha", "beta", "gamma"]
    vectors = embedder.embed_passages(texts)
    expected = np.array([fake_vector("passage: " + t) for t in texts], dtype=np.float32)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    assert vectors.shape == (3, SERVER_DIM) and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, expected, atol=1e-6)
    # batches of batch_size=2, filled shortest text first
    assert [r["body"]["input"] for r in _Handler.requests] == [["passage: beta", "passage: alpha"], ["passage: gamma"]]
    assert all(r["auth"] == f"Bearer {SECRET}" and r["body"]["model"] == "fake-embed" for r in _Handler.requests)

    query = embedder.embed_queries(["alpha"])
    assert _Handler.requests[-1]["body"]["input"] == ["query: alpha"]
    assert not np.allclose(query[0], vectors[0])
    assert embedder.embed_queries([]).shape == (0, SERVER_DIM)


def test_embed_openai_deterministic(server_url):
    embedder = get_embedder(_cfg(server_url))
    np.testing.assert_array_equal(embedder.embed_passages(["same"]), embedder.embed_passages(["same"]))


def test_embed_openai_dim_mismatch(server_url):
    embedder = get_embedder(_cfg(server_url, dim=16))
    with pytest.raises(EmbedError, match="size 8.*embed.dim=16") as info:
        embedder.embed_passages(["x"])
    assert SECRET not in str(info.value)


def test_embed_openai_http_error_is_clear_and_hides_key(server_url):
    embedder = get_embedder(_cfg(server_url.removesuffix("/v1") + "/missing"))
    with pytest.raises(EmbedError, match="failed") as info:
        embedder.embed_passages(["x"])
    assert SECRET not in str(info.value) and SECRET not in repr(embedder)


def test_embed_openai_needs_base_url():
    with pytest.raises(EmbedError, match="base_url"):
        get_embedder(EmbedConfig(backend="openai", base_url=None))


def test_embed_config_masks_api_key():
    cfg = EmbedConfig(backend="openai", api_key=SECRET)
    assert SECRET not in repr(cfg) and SECRET not in json.dumps(cfg.model_dump(mode="json"))


def test_eval_embeds_each_question_alone_several_in_flight(server_url):
    """Evaluation primes its questions one per request, as the service embeds a request's query;
    against a remote endpoint several requests are in flight (``query_concurrency``)."""
    from memlib.retrieve.tenant import CachedQueryEmbedder

    _Handler.requests.clear()
    _Handler.most_in_flight = 0
    embedder = get_embedder(_cfg(server_url, model="slow-embed", batch_size=64))
    assert embedder.query_concurrency > 1
    questions = [f"question {i}?" for i in range(12)]
    cached = CachedQueryEmbedder(embedder)
    cached.prime(questions)
    assert sorted(r["body"]["input"] for r in _Handler.requests) == sorted([["query: " + q] for q in questions])
    assert 1 < _Handler.most_in_flight <= embedder.query_concurrency
    for q in questions:
        np.testing.assert_array_equal(cached.embed_queries([q])[0], embedder.embed_queries([q])[0])



@pytest.mark.heavy
def test_bench_similarity_floor_measures_an_endpoints_embedder(server_url, tmp_path):
    """``memlib bench similarity-floor`` over real HTTP: the endpoint embeds every turn once, the
    printed setting loads and is the floor the build then applies."""
    from typer.testing import CliRunner

    from jobs.cli import app
    from memlib.config import load_config
    from memlib.embed.calibrate import chosen_floor, floor_at_quantiles
    from memlib.embed.space import similarity_floor

    lines = [json.dumps({"tenant_id": "ana", "conversation_id": "c1", "session_id": f"s{i // 10}",
                         "session_time": f"2024-01-{1 + i // 10:02d}T10:00:00+00:00", "turn_id": f"t{i}",
                         "speaker": "Ana" if i % 2 else "Bot", "role": "user" if i % 2 else "assistant",
                         "text": f"turn {i} about topic {i % 7} and hobby {i % 5}"}) for i in range(150)]
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    sets = ["embed.backend=openai", f"embed.base_url={server_url}", f"embed.api_key={SECRET}",
            "embed.model=fake-embed", f"embed.dim={SERVER_DIM}"]
    _Handler.requests.clear()
    res = CliRunner().invoke(app, ["bench", "similarity-floor", "--input", str(inp), "--format", "jsonl",
                                   *[a for s in sets for a in ("--set", s)]])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["turns"] == 150 and report["pairs"] == 150 * 149 // 2 and report["conversations"] == 1
    assert sum(len(r["body"]["input"]) for r in _Handler.requests) == 150  # each turn embedded once
    assert report["backend"] == "openai" and report["model"] == "fake-embed"
    floors = floor_at_quantiles(report["embedder_cosines"], report["default_cosines"])
    assert report["similarity_floor"] == chosen_floor(floors)
    cfg = load_config(None, sets + [report["setting"]])
    assert similarity_floor(cfg.embed) == report["similarity_floor"]


def test_bench_similarity_floor_needs_enough_pairs(server_url, tmp_path):
    from typer.testing import CliRunner

    from jobs.cli import app

    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"tenant_id": "ana", "conversation_id": "c1", "session_id": "s1", "turn_id": "t1",
                               "session_time": "2024-01-01T10:00:00+00:00", "speaker": "Ana", "role": "user",
                               "text": "hello"}) + "\n", encoding="utf-8")
    res = CliRunner().invoke(app, ["bench", "similarity-floor", "--input", str(inp), "--format", "jsonl",
                                   "--set", "embed.backend=openai", "--set", f"embed.base_url={server_url}",
                                   "--set", f"embed.dim={SERVER_DIM}"])
    assert res.exit_code == 2
    assert "0 same-conversation turn pairs; at least 10000 are needed" in res.output
