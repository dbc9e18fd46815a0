"""``memlib bench similarity-floor``: measure the configured embedder's similarity floor.

The build's cosine thresholds (clue merge, SIMILAR edges) are stated on the default encoder's
scale; another embedder's are moved onto its own by its floor (memlib.embed.space). memlib's own
backends have measured floors; an OpenAI-compatible endpoint serves a model memlib cannot know,
so measure it on your conversations and set the printed ``embed.similarity_floor``
(memlib.embed.calibrate). Prints one JSON document.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from jobs.cli.common import ConfigOpt, FormatOpt, SetOpt, fail, get_config, input_error, input_format


def register(bench_app: typer.Typer) -> None:
    @bench_app.command("similarity-floor")
    def similarity_floor(
        input: Annotated[Path, typer.Option("--input", "-i", help="conversations to measure on")],
        format: FormatOpt = None,
        config: ConfigOpt = None,
        set_: SetOpt = None,
        max_turns: Annotated[int, typer.Option("--max-turns", min=2, help="whole conversations, in input order, "
                                               "up to this many turns (each embedded twice)")] = 1500,
    ) -> None:
        """The embed.similarity_floor of the configured embedder (--set embed.backend=…), measured
        on same-conversation turn pairs against the default encoder."""
        from memlib.compose.sessions import sort_turns, turn_texts
        from memlib.embed.base import EmbedError
        from memlib.embed.calibrate import measure_floor
        from memlib.io.errors import InputError
        from memlib.io.readers import iter_tenants

        if not input.is_file():
            fail(f"input file not found: {input}")
        cfg = get_config(config, set_)
        fmt = input_format(str(input), format)
        texts: list[str] = []
        groups: list[list[int]] = []
        try:
            for result in iter_tenants(input, fmt, cfg.io):
                turns, current = sort_turns(result.turns), None
                convs = turns.column("conversation_id").to_pylist()
                for conv, text in zip(convs, turn_texts(turns, cfg).to_pylist()):
                    if not groups or conv != current:
                        if len(texts) >= max_turns:
                            break
                        groups.append([])
                        current = conv
                    groups[-1].append(len(texts))
                    texts.append(text)
                if len(texts) >= max_turns:
                    break
            report = measure_floor(texts, groups, cfg.embed)
        except (InputError, EmbedError) as exc:
            fail(input_error(exc, str(input), format))
        report["input"] = str(input)
        report["conversations"] = len(groups)
        typer.echo(json.dumps(report, indent=2))
