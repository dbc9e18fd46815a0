"""A field every turn record lacks: named before any work, with the file's likely name for it.

An export whose turns call ``text`` ``content`` (or ``tenant_id`` ``user_id``) has no valid
record at all; the readers' first pass finds this from the keys of the records it decodes anyway
and stops with one line naming the missing field and the file's candidate for it."""
from __future__ import annotations

import difflib
from collections import Counter
from typing import Any, Iterable

from memlib.schema import Role

# what a turn needs besides its optional fields (speaker, session_time, extras, kind)
REQUIRED = ("tenant_id", "conversation_id", "session_id", "turn_id", "role", "text")
KNOWN = frozenset(REQUIRED) | {"speaker", "session_time", "extras", "kind", "question_id", "question", "answer",
                               "category", "evidence", "evidence_sessions", "question_time"}
# names other exports use for memlib's fields, tried before a spelling match
SYNONYMS = {
    "text": ("content", "message", "body", "utterance", "msg", "value", "turn_text", "message_text"),
    "tenant_id": ("tenant", "user_id", "user", "customer_id", "account_id", "owner_id", "agent_id"),
    "conversation_id": ("conversation", "conv_id", "thread_id", "thread", "chat_id", "dialog_id", "dialogue_id"),
    "session_id": ("session", "sess_id", "episode_id"),
    "turn_id": ("message_id", "msg_id", "turn", "id", "utterance_id", "uuid"),
    "role": ("author_role", "sender_role", "speaker_role", "from", "author", "sender", "type"),
}


SUFFIX = "; no record can be kept, nothing was built (the format's fields: memlib/io/FORMAT.md)"


ROLES = frozenset(r.value for r in Role)
VALID_ROLE = "\x00role"  # counts the records whose role is one of ROLES


def _usable(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


class FieldTally:
    """Counts, over the turn records of one file, those holding each required field (a non-empty
    string), and every key seen; :meth:`problem` names a field that no turn record holds."""

    def __init__(self) -> None:
        self.turns = 0
        self.holding: Counter[str] = Counter()  # only whether a count is 0 is read
        self.roles: dict[str, None] = {}  # the first few role values that are not memlib's
        self._shapes: dict[tuple, int] = {}  # the records' key tuples (a file has a few) -> how many
        self._held = False  # every required field and a valid role seen: the values need no more looks

    def add(self, obj: dict[str, Any]) -> None:
        if (obj.get("kind") or "turn") != "turn":
            return
        self.turns += 1
        shape = tuple(obj)
        self._shapes[shape] = self._shapes.get(shape, 0) + 1
        if self._held:  # a turn record of an ordinary file: its key tuple counted alone (a tally of
            return      # every value of every record was half of a 27k-line index pass)
        self.holding.update(k for k in REQUIRED if _usable(obj.get(k)))
        role = obj.get("role")
        if _usable(role):
            if role.strip().lower() in ROLES:
                self.holding[VALID_ROLE] += 1
            elif len(self.roles) < 5:
                self.roles[role[:20]] = None
        self._held = all(self.holding[k] for k in REQUIRED) and self.holding[VALID_ROLE] > 0

    @property
    def keys(self) -> Counter[str]:
        """Every key seen -> the records holding it, in the order first seen."""
        keys: Counter[str] = Counter()
        for shape, n in self._shapes.items():  # in the order first seen, so the keys are too
            for k in shape:
                if isinstance(k, str):
                    keys[k] += n
        return keys

    def problem(self) -> str | None:
        """``None`` unless some required field is missing from every turn record."""
        if not self.turns:
            return None
        missing = [k for k in REQUIRED if not self.holding[k]]
        problems = [_lacking(field, self.keys, self.turns) for field in missing]
        if self.holding["role"] and not self.holding[VALID_ROLE]:
            problems.append(f"no record has a role memlib knows ({', '.join(sorted(ROLES))}); the file has "
                            f"{', '.join(repr(r) for r in self.roles)}: map them to these")
        return "; ".join(problems) + SUFFIX if problems else None


def missing_columns(names: list[str]) -> str | None:
    """For a table (Parquet): the required columns it does not have, as :meth:`FieldTally.problem` words it."""
    missing = [k for k in REQUIRED if k not in names]
    if not missing:
        return None
    keys = Counter(names)
    return "; ".join(_lacking(field, keys, 0) for field in missing).replace("every record lacks", "no column") + SUFFIX


def _lacking(field: str, keys: Counter[str], turns: int) -> str:
    present = keys[field]
    what = f"every record lacks `{field}`" if not present else \
        f"no record has a non-empty string `{field}` ({present} of {turns} have the key)"
    guess = candidate(field, [k for k in keys if k not in KNOWN])
    if guess is None:
        return what
    return f"{what}; the file has `{guess}`, perhaps it is that: map it to `{field}` and rerun"


def candidate(field: str, names: Iterable[str]) -> str | None:
    """The file's most likely name for ``field``: a known synonym, else the closest spelling."""
    names = list(names)
    lowered = {n.lower(): n for n in names}
    for alias in SYNONYMS.get(field, ()):
        if alias in lowered:
            return lowered[alias]
    close = difflib.get_close_matches(field, names, n=1, cutoff=0.6)
    return close[0] if close else None
