"""Token and cost estimates for a dry run, before any call is made.

No tokenizer of the target model is available offline, so prompt tokens are estimated from
characters with a ratio calibrated against a Llama-family BPE tokenizer on LoCoMo prompts
(``memlib bench llm`` reports the measured error), plus a fixed chat-format overhead per
message. Completion tokens are estimated per task as a share of the prompt's variable part
(the turns or facts shown), since the answer restates them.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from memlib.config import LLMConfig
from memlib.llm.models import Task

CHARS_PER_TOKEN = 3.6
MESSAGE_OVERHEAD = 4
# completion tokens ~= base + share * (tokens of the user message)
OUTPUT_SHAPE: dict[Task, tuple[int, float]] = {
    Task.FACTS: (10, 0.95), Task.REFLECTIONS: (20, 0.25), Task.TRIPLETS: (10, 0.55),
    Task.EVENTS: (10, 0.38), Task.CAUSAL: (10, 0.1), Task.OUTDATED: (8, 0.03),
    Task.ANSWER: (12, 0.0), Task.JUDGE: (10, 0.0),
}


def estimate_tokens(text: str, chars_per_token: float = CHARS_PER_TOKEN) -> int:
    return int(round(len(text) / chars_per_token))


def estimate_message_tokens(messages: list[dict[str, str]], chars_per_token: float = CHARS_PER_TOKEN) -> int:
    return sum(estimate_tokens(m["content"], chars_per_token) + MESSAGE_OVERHEAD for m in messages)


@dataclass(frozen=True)
class PlannedCall:
    """One call a stage would make: its task, unit and rendered messages."""
    task: Task
    unit_id: str
    messages: list[dict[str, str]]


@dataclass
class Estimate:
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    by_task: dict[str, dict[str, int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"calls": self.calls, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens, "cost_usd": round(self.cost, 4),
                "by_task": self.by_task}


def estimate_output_tokens(call: PlannedCall, chars_per_token: float = CHARS_PER_TOKEN) -> int:
    base, share = OUTPUT_SHAPE[call.task]
    user = sum(estimate_tokens(m["content"], chars_per_token) for m in call.messages if m["role"] == "user")
    return int(round(base + share * user))


def estimate(units: Iterable[PlannedCall], cfg: LLMConfig) -> Estimate:
    """Calls, input/output tokens and cost (from ``cfg.price_per_million`` for ``cfg.model``)."""
    out = Estimate()
    for call in units:
        tin = estimate_message_tokens(call.messages, cfg.chars_per_token)
        tout = estimate_output_tokens(call, cfg.chars_per_token)
        out.calls += 1
        out.input_tokens += tin
        out.output_tokens += tout
        agg = out.by_task.setdefault(call.task.value, {"calls": 0, "input_tokens": 0, "output_tokens": 0})
        agg["calls"] += 1
        agg["input_tokens"] += tin
        agg["output_tokens"] += tout
    price = cfg.price_per_million.get(cfg.model, {"input": 0.0, "output": 0.0})
    out.cost = (out.input_tokens * price.get("input", 0.0) + out.output_tokens * price.get("output", 0.0)) / 1e6
    return out
