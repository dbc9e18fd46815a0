"""The one LLM call path: cache -> retry -> rate limit -> metrics.

``LLMClient.call(task, variables, ...)`` renders the task's prompt, looks the request up in
the file cache, and otherwise sends it through the openai client to any OpenAI-compatible
endpoint. Timeouts, connection errors, 429 (honouring ``retry-after``), 5xx, invalid JSON
and truncated JSON are retried with exponential backoff and full jitter. An answer that
parses but fails the task's pydantic model gets one repair request; after that the call is
a recorded error. Every call appends one ``schema.LLM_CALLS`` row whose ``error`` column
lists every failed attempt (also for calls that finally succeeded).
"""
from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any

import openai
import pyarrow as pa
from pydantic import BaseModel, ValidationError

from memlib import schema
from memlib.config import LLMConfig
from memlib.ids import make_id
from memlib.llm.cache import ResponseCache, cache_key
from memlib.llm.estimate import estimate_message_tokens
from memlib.llm.limiter import LocalRateLimiter, RateLimiter
from memlib.llm.models import TASKS, Task
from memlib.llm.prompts import DEFAULT_DIR, Prompt, load_prompts

RETRY_AFTER_MAX_S = 120.0


class CallStatus(str, Enum):
    OK = "ok"
    CACHED = "cached"
    ERROR = "error"


class _Transient(Exception):
    def __init__(self, message: str, retry_after: float | None = None, exchange: "_Exchange | None" = None):
        super().__init__(message)
        self.retry_after = retry_after
        self.exchange = exchange  # a reply that arrived but cannot be used: its tokens were still spent


class _Fatal(Exception):
    pass


@dataclass
class CallResult:
    task: Task
    unit_id: str
    status: CallStatus
    output: BaseModel | None
    prompt_version: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.output is not None


@dataclass
class _Exchange:
    content: str
    prompt_tokens: int
    completion_tokens: int


def _retry_after(exc: openai.APIStatusError) -> float | None:
    value = exc.response.headers.get("retry-after") if exc.response is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


class LLMClient:
    """Built once per worker/actor; thread-safe for concurrent ``call``s."""

    def __init__(self, cfg: LLMConfig, *, cache_dir: str | Path | None = None,
                 limiter: RateLimiter | None = None, prompts: dict[Task, Prompt] | None = None,
                 sleep: Callable[[float], None] = time.sleep, seed: int | None = None):
        self.cfg = cfg
        self.prompts = prompts or load_prompts(Path(cfg.prompts_dir) if cfg.prompts_dir else DEFAULT_DIR)
        self.cache = ResponseCache(cache_dir) if cache_dir is not None else None
        self.limiter = limiter or LocalRateLimiter(cfg.requests_per_minute, cfg.tokens_per_minute)
        self._sleep = sleep
        self._rng = random.Random(seed)
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        key = cfg.api_key.get_secret_value() if cfg.api_key is not None else "none"
        self._api = openai.OpenAI(base_url=cfg.base_url, api_key=key, timeout=cfg.timeout_s,
                                  max_retries=0)

    # -- public -------------------------------------------------------------------------
    def prompt_version(self, task: Task) -> str:
        return self.prompts[task].prompt_version

    def messages(self, task: Task, variables: dict[str, str]) -> list[dict[str, str]]:
        return self.prompts[task].render(variables)

    def call(self, task: Task, variables: dict[str, str], *, unit_id: str,
             tenant_id: str | None = None) -> CallResult:
        prompt = self.prompts[task]
        messages = prompt.render(variables)
        model = TASKS[task].output
        key = cache_key(model=self.cfg.model, messages=messages, schema=model.model_json_schema(),
                        sampling=self._sampling(), prompt_version=prompt.prompt_version,
                        cache_version=self.cfg.cache_version)
        row = {"tenant_id": tenant_id, "task": task.value, "unit_id": unit_id, "model": self.cfg.model,
               "prompt_hash": prompt.prompt_version, "cache_key": key, "prompt_tokens": 0,
               "completion_tokens": 0, "attempts": 0, "error": None}
        started = time.perf_counter()
        cached = self.cache.get(key) if self.cache is not None else None
        if cached is not None:
            output = model.model_validate(cached["output"])
            return self._finish(row, started, CallStatus.CACHED, output, task, prompt)
        output, errors = self._call_with_retries(messages, model, row)
        row["error"] = "; ".join(errors) or None
        if output is None:
            return self._finish(row, started, CallStatus.ERROR, None, task, prompt)
        if self.cache is not None:
            self.cache.put(key, {"task": task.value, "model": self.cfg.model,
                                 "prompt_version": prompt.prompt_version,
                                 "output": output.model_dump(mode="json"),
                                 "usage": {"prompt_tokens": row["prompt_tokens"],
                                           "completion_tokens": row["completion_tokens"]}})
        return self._finish(row, started, CallStatus.OK, output, task, prompt)

    def calls_table(self) -> pa.Table:
        """Every call so far as ``schema.LLM_CALLS`` rows."""
        with self._lock:
            rows = list(self._rows)
        if not rows:
            return schema.empty(schema.LLM_CALLS)
        return schema.conform(pa.Table.from_pylist(rows), schema.LLM_CALLS, name="llm_calls")

    def drain_calls(self) -> pa.Table:
        """Like :meth:`calls_table`, and forget the rows (for per-batch accounting)."""
        table = self.calls_table()
        with self._lock:
            self._rows = self._rows[table.num_rows:]
        return table

    # -- layers -------------------------------------------------------------------------
    def _sampling(self) -> dict[str, Any]:
        return {"temperature": self.cfg.temperature, "max_tokens": self.cfg.max_tokens,
                "response_format": "json_object"}

    def _call_with_retries(self, messages: list[dict[str, str]], model: type[BaseModel],
                           row: dict[str, Any]) -> tuple[BaseModel | None, list[str]]:
        errors: list[str] = []
        repaired = False
        failures = 0
        while True:
            row["attempts"] += 1
            try:
                exchange = self._send(messages)
                row["prompt_tokens"] += exchange.prompt_tokens
                row["completion_tokens"] += exchange.completion_tokens
                data = self._parse_json(exchange)
                return model.model_validate(data), errors
            except ValidationError as exc:
                errors.append(f"attempt {row['attempts']}: schema: {_short(exc)}")
                if repaired:
                    return None, errors
                repaired = True
                messages = messages + [
                    {"role": "assistant", "content": exchange.content},
                    {"role": "user", "content": "That JSON does not match the required shape: "
                     f"{_short(exc)}. Reply with corrected JSON only."}]
            except _Transient as exc:
                if exc.exchange is not None:
                    row["prompt_tokens"] += exc.exchange.prompt_tokens
                    row["completion_tokens"] += exc.exchange.completion_tokens
                errors.append(f"attempt {row['attempts']}: {exc}")
                failures += 1
                if failures > self.cfg.max_retries:
                    return None, errors
                self._sleep(self._backoff(failures, exc.retry_after))
            except _Fatal as exc:
                errors.append(f"attempt {row['attempts']}: {exc}")
                return None, errors

    def _backoff(self, failures: int, retry_after: float | None) -> float:
        if retry_after is not None:  # the server's word wins over our own cap, within reason
            return min(max(self.cfg.backoff_max_s, RETRY_AFTER_MAX_S), retry_after)
        cap = min(self.cfg.backoff_max_s, self.cfg.backoff_base_s * 2 ** (failures - 1))
        return self._rng.uniform(0.0, cap)

    def _send(self, messages: list[dict[str, str]]) -> _Exchange:
        wait = self.limiter.reserve(estimate_message_tokens(messages) + self.cfg.max_tokens // 4)
        if wait > 0:
            self._sleep(wait)
        try:
            resp = self._api.chat.completions.create(
                model=self.cfg.model, messages=messages, temperature=self.cfg.temperature,
                max_tokens=self.cfg.max_tokens, response_format={"type": "json_object"})
        except openai.APITimeoutError as exc:
            raise _Transient("timeout") from exc
        except openai.APIConnectionError as exc:
            raise _Transient(f"connection: {type(exc).__name__}") from exc
        except openai.RateLimitError as exc:
            raise _Transient("429 rate limited", _retry_after(exc)) from exc
        except openai.APIStatusError as exc:
            if exc.status_code >= 500:
                raise _Transient(f"{exc.status_code} server error") from exc
            raise _Fatal(f"{exc.status_code} {type(exc).__name__}") from exc
        choice = resp.choices[0] if resp.choices else None
        usage = resp.usage
        exchange = _Exchange(content=(choice.message.content or "") if choice else "",
                             prompt_tokens=usage.prompt_tokens if usage else 0,
                             completion_tokens=usage.completion_tokens if usage else 0)
        if choice is not None and choice.finish_reason == "length":
            raise _Transient("truncated: finish_reason=length", exchange=exchange)
        return exchange

    @staticmethod
    def _parse_json(exchange: _Exchange) -> Any:
        text = exchange.content.strip()
        if text.startswith("```"):
            text = text.strip("`").removeprefix("json").strip()
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            kind = "truncated JSON" if exc.pos >= len(text) - 1 else "invalid JSON"
            raise _Transient(f"{kind}: {exc.msg} at {exc.pos}") from exc

    def _finish(self, row: dict[str, Any], started: float, status: CallStatus,
                output: BaseModel | None, task: Task, prompt: Prompt) -> CallResult:
        row["status"] = status.value
        row["latency_ms"] = (time.perf_counter() - started) * 1000.0
        row["created_at"] = datetime.now(timezone.utc)
        row["call_id"] = make_id("llmcall", row["cache_key"], row["created_at"].isoformat(),
                                 threading.get_ident())
        with self._lock:
            self._rows.append(row)
        return CallResult(task, row["unit_id"], status, output, prompt.prompt_version, row["error"])


def _short(exc: ValidationError) -> str:
    parts = [f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors()[:3]]
    return "; ".join(parts)
