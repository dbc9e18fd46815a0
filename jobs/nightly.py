"""``python -m jobs.nightly ARGS`` is ``memlib build --incremental ARGS`` (the cron / RayJob entrypoint)."""
from __future__ import annotations

import sys

from jobs.cli import command_parser, run

COMMAND = ("build", "--incremental")


def parser():
    """The options of ``memlib build --incremental``, to check an entrypoint's arguments."""
    return command_parser(*COMMAND)


def main(argv: list[str] | None = None) -> int:
    return run([*COMMAND, *(sys.argv[1:] if argv is None else argv)], prog_name="python -m jobs.nightly")


if __name__ == "__main__":
    raise SystemExit(main())
