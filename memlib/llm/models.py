"""Pydantic output models of every LLM task and the task registry.

Each :class:`Task` names one prompt file in ``prompts/`` (``<task>.txt``), the placeholders
the code fills in, and the model its JSON answer is validated against. Turn, fact and event
references are integer indices into the numbered lists shown in the prompt.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field


class Task(str, Enum):
    FACTS = "facts"
    REFLECTIONS = "reflections"
    TRIPLETS = "triplets"
    EVENTS = "events"
    CAUSAL = "causal"
    OUTDATED = "outdated"
    ANSWER = "answer"
    JUDGE = "judge"


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore")


Indices = list[int]


class FactItem(_Out):
    text: str = Field(min_length=1)
    turns: Indices
    concepts: list[str] = Field(default_factory=list)


class FactsOut(_Out):
    facts: list[FactItem]


class ReflectionItem(_Out):
    text: str = Field(min_length=1)
    facts: Indices


class ReflectionsOut(_Out):
    reflections: list[ReflectionItem]


class TripletItem(_Out):
    s: str = Field(min_length=1)
    r: str = Field(min_length=1)
    o: str = Field(min_length=1)
    turns: Indices


class EntityItem(_Out):
    name: str = Field(min_length=1)
    type: str = ""
    description: str = ""
    turns: Indices = Field(default_factory=list)


class TripletsOut(_Out):
    triplets: list[TripletItem]
    entities: list[EntityItem] = Field(default_factory=list)


class EventItem(_Out):
    text: str = Field(min_length=1)
    turns: Indices
    entities: list[str] = Field(default_factory=list)
    topic: str = ""
    dates: list[str] = Field(default_factory=list)


class EventsOut(_Out):
    events: list[EventItem]


class CausalLink(_Out):
    cause: int
    effect: int
    why: str = ""


class CausalOut(_Out):
    links: list[CausalLink]


class Replacement(_Out):
    new: int
    old: int


class OutdatedOut(_Out):
    replaced: list[Replacement]


class AnswerOut(_Out):
    answer: str


class JudgeOut(_Out):
    covered: Indices
    correct: bool


@dataclass(frozen=True)
class TaskSpec:
    task: Task
    output: type[BaseModel]
    placeholders: frozenset[str]


def _spec(task: Task, output: type[BaseModel], *names: str) -> TaskSpec:
    return TaskSpec(task, output, frozenset(names))


TASKS: dict[Task, TaskSpec] = {s.task: s for s in (
    _spec(Task.FACTS, FactsOut, "turns", "session_date", "existing_facts", "existing_concepts",
          "related_episodes"),
    _spec(Task.REFLECTIONS, ReflectionsOut, "facts", "existing_reflections"),
    _spec(Task.TRIPLETS, TripletsOut, "turns", "session_date"),
    _spec(Task.EVENTS, EventsOut, "turns", "session_date"),
    _spec(Task.CAUSAL, CausalOut, "events"),
    _spec(Task.OUTDATED, OutdatedOut, "new_facts", "old_facts"),
    _spec(Task.ANSWER, AnswerOut, "question", "context", "question_date"),
    _spec(Task.JUDGE, JudgeOut, "question", "key_facts", "answer"),
)}
