"""memlib.lazy.cached_property: computed once per instance, and one instance's slow computation
never holds up another's (functools' 3.11 version serialized them behind one class-wide lock)."""
from __future__ import annotations

import threading

from memlib.lazy import cached_property


class Slow:
    def __init__(self, gate: threading.Event | None = None):
        self.gate, self.calls = gate, 0

    @cached_property
    def value(self) -> int:
        """the doc"""
        self.calls += 1
        if self.gate is not None:
            assert self.gate.wait(10)
        return 42


def test_computed_once_then_read_from_the_instance():
    s = Slow()
    assert s.value == 42 and s.value == 42 and s.calls == 1
    assert Slow.value.__doc__ == "the doc" and "value" in s.__dict__


def test_one_instance_computing_does_not_block_another():
    gate = threading.Event()
    blocked = Slow(gate)
    started = threading.Thread(target=lambda: blocked.value, daemon=True)
    started.start()
    done = threading.Event()
    threading.Thread(target=lambda: (Slow().value, done.set()), daemon=True).start()
    try:
        assert done.wait(5), "the second instance waited for the first one's computation"
    finally:
        gate.set()
        started.join(10)
    assert blocked.value == 42
