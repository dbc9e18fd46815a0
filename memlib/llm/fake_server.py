"""A local OpenAI-compatible HTTP server for tests and offline benchmarks.

It answers ``POST /v1/chat/completions`` with JSON of realistic size built from the prompt
(one fact per informative turn, triplets and entities, events, ...) and ``POST
/v1/embeddings`` with deterministic vectors, and injects faults on request: a delay past the
client timeout, 429 with ``retry-after``, 500, invalid JSON, JSON truncated mid-object, and
JSON of the wrong shape. Usage counts come from a Llama-family BPE tokenizer when one is
installed (wordllama ships one), else from whitespace words. It counts every request.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_LINE = re.compile(r"^\[(\d+)\] ([^:\n]{1,40}): (.+)$", re.MULTILINE)
_KEY = re.compile(r'Return \{"(\w+)"')
_CAP = re.compile(r"\b([A-Z][a-z]{2,})\b")


class Fault(str, Enum):
    TIMEOUT = "timeout"
    RATE_LIMIT = "rate_limit"
    SERVER_ERROR = "server_error"
    INVALID_JSON = "invalid_json"
    TRUNCATED = "truncated"
    WRONG_SCHEMA = "wrong_schema"


def _load_tokenizer() -> Any:
    try:
        from importlib.resources import files

        from tokenizers import Tokenizer
        path = files("wordllama") / "tokenizers" / "l2_supercat_tokenizer_config.json"
        return Tokenizer.from_file(str(path))
    except Exception:  # noqa: BLE001 - any failure: fall back to word counts
        return None


class TokenCounter:
    def __init__(self) -> None:
        self._tok = _load_tokenizer()

    def count(self, text: str) -> int:
        if self._tok is None:
            return len(text.split())
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def messages(self, messages: list[dict[str, str]]) -> int:
        return sum(self.count(m.get("content") or "") + 4 for m in messages)


def _words(text: str, n: int) -> str:
    return " ".join(text.split()[:n]).rstrip(".,!?")


def _snake(text: str) -> str:
    ws = [w.lower() for w in re.findall(r"[A-Za-z]{4,}", text)][:2]
    return "_".join(ws) if len(ws) == 2 else "daily_life"


def _answer(key: str, user: str) -> dict[str, Any]:
    """A plausible answer of realistic size for the task named by its first output key."""
    turns = [(int(i), s.strip(), t) for i, s, t in _LINE.findall(user)]
    rich = [(i, s, t) for i, s, t in turns if len(t.split()) >= 6]
    if key == "facts":
        return {"facts": [{"text": f"{s} said {_words(t, 16)}.", "turns": [i], "concepts": [_snake(t)]}
                          for i, s, t in rich]}
    if key == "triplets":
        trips, ents = [], {}
        for i, s, t in rich[::2]:
            obj = next(iter(_CAP.findall(t.split(" ", 1)[-1])), _words(t, 3))
            trips.append({"s": s, "r": "talked about", "o": obj, "turns": [i]})
            ents.setdefault(s, {"name": s, "type": "person", "description": f"{s}: {_words(t, 10)}.", "turns": [i]})
            ents.setdefault(obj, {"name": obj, "type": "thing", "description": f"Mentioned by {s}.", "turns": [i]})
        return {"triplets": trips, "entities": list(ents.values())}
    if key == "events":
        return {"events": [{"text": f"{s} {_words(t, 12)}.", "turns": [i], "entities": [s],
                            "topic": _snake(t).replace("_", " "), "dates": []} for i, s, t in rich[::3]]}
    items = re.findall(r"^\[(\d+)\] (.+)$", user, re.MULTILINE)
    if key == "reflections":
        return {"reflections": [{"text": f"Pattern: {_words(items[j][1], 10)}.", "facts": [j, j + 1]}
                                for j in range(0, len(items) - 1, 6)][:5]}
    if key == "links":
        return {"links": [{"cause": 0, "effect": 1, "why": "the first enabled the second"}] if len(items) > 1 else []}
    simple = {"replaced": [], "answer": "unknown", "covered": []}
    out = {key: simple.get(key, [])}
    if key == "covered":
        out["correct"] = False
    return out


@dataclass
class ServerState:
    fault_rate: float = 0.0
    faults: tuple[Fault, ...] = tuple(Fault)
    delay_s: float = 2.0
    retry_after_s: float = 0.05
    seed: int = 0
    requests: int = 0
    chat_requests: int = 0
    injected: list[Fault] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    rng: random.Random = field(default_factory=random.Random)
    counter: TokenCounter = field(default_factory=TokenCounter)

    def pick_fault(self) -> Fault | None:
        with self.lock:
            self.requests += 1
            self.chat_requests += 1
            self.times.append(time.monotonic())
            if self.fault_rate > 0 and self.rng.random() < self.fault_rate:
                fault = self.rng.choice(self.faults)
                self.injected.append(fault)
                return fault
        return None


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        return

    def _send(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path.endswith("/embeddings"):
            self._embeddings(body)
        elif self.path.endswith("/chat/completions"):
            self._chat(body)
        else:
            self._send(404, b'{"error": {"message": "not found"}}')

    def _embeddings(self, body: dict[str, Any]) -> None:
        st = self.server.state
        with st.lock:
            st.requests += 1
        inputs = body.get("input") or []
        inputs = [inputs] if isinstance(inputs, str) else inputs
        data = []
        for i, text in enumerate(inputs):
            rnd = random.Random(hashlib.sha256(str(text).encode()).digest())
            data.append({"object": "embedding", "index": i, "embedding": [rnd.gauss(0, 1) for _ in range(64)]})
        self._send(200, json.dumps({"object": "list", "data": data, "model": body.get("model", "fake"),
                                    "usage": {"prompt_tokens": 0, "total_tokens": 0}}).encode())

    def _chat(self, body: dict[str, Any]) -> None:
        st = self.server.state
        fault = st.pick_fault()
        if fault is Fault.TIMEOUT:
            time.sleep(st.delay_s)
        if fault is Fault.RATE_LIMIT:
            return self._send(429, b'{"error": {"message": "rate limited"}}', {"retry-after": str(st.retry_after_s)})
        if fault is Fault.SERVER_ERROR:
            return self._send(500, b'{"error": {"message": "internal error"}}')
        messages = body.get("messages") or []
        user = "\n".join(m.get("content") or "" for m in messages if m.get("role") == "user")
        m = _KEY.search(messages[1]["content"] if len(messages) > 1 else user)
        content = json.dumps(_answer(m.group(1) if m else "answer", user))
        if fault is Fault.INVALID_JSON:
            content = "Sure! Here is the JSON you asked for: " + content
        elif fault is Fault.TRUNCATED:
            content = content[: max(1, len(content) // 2)]
        elif fault is Fault.WRONG_SCHEMA:
            content = json.dumps({"result": "ok", "items": 3})
        finish = "length" if fault is Fault.TRUNCATED else "stop"  # what a server says when max_tokens cut it
        pt, ct = st.counter.messages(messages), st.counter.count(content)
        with st.lock:
            st.prompt_tokens += pt
            st.completion_tokens += ct
        resp = {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "fake"),
                "choices": [{"index": 0, "finish_reason": finish,
                             "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}}
        self._send(200, json.dumps(resp).encode())


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: ServerState


class FakeLLMServer:
    """Context manager: ``with FakeLLMServer(fault_rate=0.2) as srv: srv.url``."""

    def __init__(self, **state: Any):
        self.state = ServerState(**state)
        self.state.rng.seed(self.state.seed)
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.state = self.state
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> FakeLLMServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
