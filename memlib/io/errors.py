"""Errors raised by the input readers."""
from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """A file that cannot be read at all (missing, not JSON at top level, wrong structure).

    Bad *records* inside a readable file are not errors: they go to the quarantine table.
    The message is one line naming the file and the reason, fit to print without a traceback.
    """

    def __init__(self, path: str | Path, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")
