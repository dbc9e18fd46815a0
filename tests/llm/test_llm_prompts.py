from pathlib import Path

import pytest

from memlib.llm.models import TASKS, Task
from memlib.llm.prompts import DEFAULT_DIR, PromptError, load_prompt, load_prompts, parse_prompt

GOOD = """#@ task: events
#@ version: 3
=== system ===
Write a clue. Return JSON only.
=== user ===
Date: {session_date}
{turns}
Return {"clue": "..."}.
"""


def test_all_prompts_load_with_versions():
    prompts = load_prompts()
    assert set(prompts) == set(Task)
    versions = {p.prompt_version for p in prompts.values()}
    assert len(versions) == len(Task)
    assert all(v.split("@")[0] in {t.value for t in Task} for v in versions)


def test_parse_ok_and_json_braces_are_literal():
    p = parse_prompt(GOOD, TASKS[Task.EVENTS])
    msgs = p.render({"turns": "[0] A: hi", "session_date": "2023-05-01"})
    assert '{"clue": "..."}' in msgs[1]["content"] and "[0] A: hi" in msgs[1]["content"]


def test_missing_placeholder_fails():
    text = GOOD.replace("Date: {session_date}\n", "")
    with pytest.raises(PromptError, match="session_date"):
        parse_prompt(text, TASKS[Task.EVENTS])


def test_unknown_placeholder_fails():
    text = GOOD.replace("{turns}", "{turns}\n{speaker_notes}")
    with pytest.raises(PromptError, match="speaker_notes"):
        parse_prompt(text, TASKS[Task.EVENTS])


def test_missing_file_and_wrong_task_fail(tmp_path: Path):
    with pytest.raises(PromptError, match="missing"):
        load_prompt(Task.EVENTS, tmp_path)
    (tmp_path / "events.txt").write_text(GOOD.replace("task: events", "task: facts"))
    with pytest.raises(PromptError, match="header task"):
        load_prompt(Task.EVENTS, tmp_path)


def test_render_rejects_wrong_variables():
    p = load_prompt(Task.TRIPLETS, DEFAULT_DIR)
    with pytest.raises(PromptError):
        p.render({"turns": "x"})
    with pytest.raises(PromptError):
        p.render({"turns": "x", "session_date": "y", "extra": "z"})


def test_hash_changes_with_text():
    a = parse_prompt(GOOD, TASKS[Task.EVENTS])
    b = parse_prompt(GOOD.replace("Write a clue.", "Write one clue."), TASKS[Task.EVENTS])
    assert a.prompt_version != b.prompt_version
