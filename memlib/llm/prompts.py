"""Prompt files: loading, validation and rendering.

A prompt file ``prompts/<task>.txt`` has a header of ``#@ key: value`` lines (``task``,
``version``), then a ``=== system ===`` and a ``=== user ===`` section. Placeholders are
``{name}`` with a lowercase identifier; other braces (JSON examples) are literal text.
:func:`load_prompts` fails at start when a file is missing, or when its placeholders
differ from the task's declared set (a missing or an unused placeholder).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from memlib.llm.models import TASKS, Task, TaskSpec

PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
_SECTION = re.compile(r"^=== (system|user) ===$", re.MULTILINE)
# the prompt files ship inside the package (memlib/prompts, a link to the repository's prompts/ in a
# source tree, real files in a wheel), so an installed memlib finds them like a checkout does
DEFAULT_DIR = Path(__file__).resolve().parents[1] / "prompts"


class PromptError(ValueError):
    pass


@dataclass(frozen=True)
class Prompt:
    spec: TaskSpec
    version: str
    system: str
    user: str
    digest: str

    @property
    def prompt_version(self) -> str:
        """Stored with every extracted row: ``<task>@v<version>:<hash of the file>``."""
        return f"{self.spec.task.value}@v{self.version}:{self.digest}"

    def render(self, variables: dict[str, str]) -> list[dict[str, str]]:
        """Chat messages with every placeholder filled; fails on a missing or extra variable."""
        given = set(variables)
        if given != self.spec.placeholders:
            raise PromptError(f"{self.spec.task.value}: variables {sorted(given)} do not match "
                              f"placeholders {sorted(self.spec.placeholders)}")
        fill = lambda m: str(variables[m.group(1)])  # noqa: E731
        return [{"role": "system", "content": PLACEHOLDER.sub(fill, self.system)},
                {"role": "user", "content": PLACEHOLDER.sub(fill, self.user)}]


def parse_prompt(text: str, spec: TaskSpec, origin: str = "<prompt>") -> Prompt:
    header = dict(re.findall(r"^#@ (\w+): *(.*?)\s*$", text, re.MULTILINE))
    if header.get("task") != spec.task.value:
        raise PromptError(f"{origin}: header task {header.get('task')!r} != {spec.task.value!r}")
    if not header.get("version"):
        raise PromptError(f"{origin}: header has no version")
    parts = _SECTION.split(text)
    sections = dict(zip(parts[1::2], (p.strip() for p in parts[2::2])))
    if set(sections) != {"system", "user"}:
        raise PromptError(f"{origin}: needs one '=== system ===' and one '=== user ===' section")
    used = set(PLACEHOLDER.findall(sections["system"] + "\n" + sections["user"]))
    missing = spec.placeholders - used
    unknown = used - spec.placeholders
    if missing:
        raise PromptError(f"{origin}: placeholder(s) {sorted(missing)} declared for task "
                          f"{spec.task.value} are not used in the prompt")
    if unknown:
        raise PromptError(f"{origin}: placeholder(s) {sorted(unknown)} are not provided by task "
                          f"{spec.task.value}")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    return Prompt(spec, header["version"], sections["system"], sections["user"], digest)


def load_prompt(task: Task, directory: Path = DEFAULT_DIR) -> Prompt:
    path = Path(directory) / f"{task.value}.txt"
    if not path.exists():
        raise PromptError(f"prompt file missing for task {task.value}: {path}")
    return parse_prompt(path.read_text(encoding="utf-8"), TASKS[task], str(path))


def load_prompts(directory: Path = DEFAULT_DIR, tasks: list[Task] | None = None) -> dict[Task, Prompt]:
    """Load and validate the prompts of ``tasks`` (all tasks by default)."""
    return {t: load_prompt(t, directory) for t in (tasks or list(Task))}


def prompt_hashes(prompts: dict[Task, Prompt]) -> dict[str, str]:
    """``{task: prompt_version}`` for the manifest."""
    return {t.value: p.prompt_version for t, p in prompts.items()}
