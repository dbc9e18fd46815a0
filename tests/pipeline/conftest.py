"""Pipeline fixtures: a tiny three-tenant JSONL input (written here, not taken from any
benchmark) with malformed lines, and one store built from it by `memlib build`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

SESSIONS = {
    "ana": [
        ("2023-05-08T10:00:00+00:00", [
            ("user", "Ana", "Yesterday I adopted a grey kitten called Pixel from the shelter in Porto."),
            ("assistant", "Bot", "Congratulations! How is Pixel settling in?"),
            ("user", "Ana", "She hides under my desk but she loves the feather toy my sister Rita gave me."),
            ("assistant", "Bot", "Kittens often hide for the first days."),
            ("user", "Ana", "Thanks!"),
        ]),
        ("2023-06-02T18:30:00+00:00", [
            ("user", "Ana", "I started training for the Lisbon half marathon in October."),
            ("assistant", "Bot", "Nice goal. How many runs per week are you planning?"),
            ("user", "Ana", "Three runs a week, and my longest run so far was 14 kilometres."),
        ]),
    ],
    "ben": [
        ("2023-03-14T09:00:00+00:00", [
            ("user", "Ben", "I'm moving to Glasgow next month for a job at a robotics startup."),
            ("assistant", "Bot", "Exciting! Have you found a flat yet?"),
            ("user", "Ben", "Not yet, I want something near the river with space for my drum kit."),
            ("assistant", "Bot", "Good luck with the search."),
        ]),
        ("2023-04-20T20:15:00+00:00", [
            ("user", "Ben", "Haha ok"),
            ("user", "Ben", "I found a flat in Finnieston and my first week at the startup went well."),
            ("assistant", "Bot", "Great news. What are you building there?"),
            ("user", "Ben", "Warehouse robots that sort parcels; I write the motion planning code in Rust."),
        ]),
    ],
    "cara": [
        ("2023-09-01T12:00:00+00:00", [
            ("user", "Cara", "My grandmother turns ninety next Saturday and we are baking her a lemon cake."),
            ("assistant", "Bot", "Lovely. Is it a family recipe?"),
            ("user", "Cara", "Yes, it is from her own notebook, written in 1961."),
            ("assistant", "Bot", "That makes it special."),
            ("user", "Cara", "I am also learning the cello, I practise every evening after work."),
        ]),
    ],
}
QUESTIONS = [
    {"kind": "question", "tenant_id": "ana", "question_id": "ana:q1", "question": "What is the name of Ana's kitten?",
     "evidence": ["s1:1"], "category": "single-hop", "answer": "Pixel"},
    {"kind": "question", "tenant_id": "ben", "question_id": "ben:q1", "question": "Where did Ben find a flat?",
     "evidence": ["s2:2"], "category": "single-hop", "answer": "Finnieston"},
]
MALFORMED = [
    '{"tenant_id": "ana", "conversation_id": "ana-c", "session_id": "s9", "turn_id": "bad:1", "text": ',
    json.dumps({"tenant_id": "ben", "conversation_id": "ben-c", "session_id": "s3", "session_time": "not a date",
                "turn_id": "s3:1", "speaker": "Ben", "role": "user", "text": "broken date"}),
]


def turn_lines() -> list[str]:
    lines = []
    for tenant, sessions in SESSIONS.items():
        for si, (when, turns) in enumerate(sessions, start=1):
            for ti, (role, speaker, text) in enumerate(turns, start=1):
                lines.append(json.dumps({"tenant_id": tenant, "conversation_id": f"{tenant}-c",
                                         "session_id": f"s{si}", "session_time": when, "turn_id": f"s{si}:{ti}",
                                         "speaker": speaker, "role": role, "text": text}))
    return lines


def write_input(path: Path) -> Path:
    lines = turn_lines()
    lines[3:3] = MALFORMED
    lines += [json.dumps(q) for q in QUESTIONS]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_input(tmp_path_factory) -> Path:
    return write_input(tmp_path_factory.mktemp("pipeline_input") / "tiny.jsonl")


def run_cli(args: list[str]):
    from typer.testing import CliRunner

    from jobs.cli import app

    return CliRunner().invoke(app, args)


BLOCK_TURNS = 7


@pytest.fixture(scope="session")
def built_store(ray_local, tiny_input, tmp_path_factory) -> Path:
    """`memlib build` on the tiny input, on the local 2-CPU Ray of the test session."""
    out = tmp_path_factory.mktemp("pipeline_store") / "store"
    # blocks of at most 7 turns: ana's two sessions land in two blocks, the second shared with ben
    result = run_cli(["build", "--input", str(tiny_input), "--format", "jsonl", "--out", str(out), "--num-cpus", "2",
                      "--set", f"ray.block_turns={BLOCK_TURNS}"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return out
