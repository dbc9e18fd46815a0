"""One progress display for builds, nightly runs and evals.

On a terminal a status line is redrawn in place (phase, blocks and tenants N/M, rate, ETA); when
stdout is not a terminal (a log file, a CI job, a cron mail) nothing is redrawn and each phase
prints one line when it ends, so a log holds what happened and not ten thousand updates.
:class:`BuildProgress` turns the build driver's progress events (``jobs.builder.run.Progress``)
into those lines; :class:`CountProgress` is the eval's (one counter per strategy).
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO


def clock(seconds: float) -> str:
    """``seconds`` as m:ss (or h:mm:ss)."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def rate_text(per_s: float) -> str:
    """A rate a reader takes in at a glance: per second, or per minute when below one a second."""
    return f"{per_s:.1f}/s" if per_s >= 1 else f"{per_s * 60:.1f}/min"


def format_count(label: str, done: int, total: int | None, elapsed: float) -> str:
    """``tenants 3/4  1.5/s  ETA 0:01``: the count, its rate so far and the time left at that rate
    (no rate before the first item, no ETA once done or without a total)."""
    parts = [f"{label} {done}/{total}" if total else f"{label} {done}"]
    if done and elapsed > 0:
        per_s = done / elapsed
        parts.append(rate_text(per_s))
        if total and done < total:
            parts.append(f"ETA {clock((total - done) / per_s)}")
    return "  ".join(parts)


class Display:
    """Lines that stay, and one status line that a terminal redraws (throttled) and a log never sees."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None,
                 now: Callable[[], float] = time.monotonic, min_interval: float = 0.1):
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.now = now
        self.min_interval = min_interval
        self._shown = ""       # the status line on screen (TTY only)
        self._drawn_at = -1e9

    def line(self, text: str) -> None:
        self._clear()
        self.stream.write(text + "\n")
        self.stream.flush()

    def status(self, text: str, force: bool = False) -> None:
        if not self.tty:
            return
        t = self.now()
        if not force and t - self._drawn_at < self.min_interval:
            return
        self._drawn_at = t
        self.stream.write("\r\x1b[K" + text)
        self.stream.flush()
        self._shown = text

    def close(self) -> None:
        """Wipe the status line (an error or a summary follows on a clean line)."""
        self._clear()
        self.stream.flush()

    def _clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self._shown = ""


PHASE_WORDS = {"ray_start": "ray", "write": "write", "index": "index", "publish": "publish"}


class BuildProgress(Display):
    """The build driver's progress events as lines: the plan first (before Ray starts), Ray's
    start, the tenants phase as blocks and tenants N/M with rate and ETA, then write, index and
    publish. ``verbose`` adds a line per tenant."""

    def __init__(self, verbose: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.verbose = verbose
        self.blocks = self.tenants = self.failed = 0
        self.total_blocks = self.total_tenants = 0
        self.started = self.now()

    def __call__(self, event: str, info: dict[str, Any]) -> None:
        handler = getattr(self, f"on_{event}", None)
        if handler is not None:
            handler(info)

    def counters(self) -> str:
        elapsed = self.now() - self.started
        parts = [format_count("tenants", self.tenants, self.total_tenants, elapsed)]
        if self.total_blocks:
            parts.insert(0, f"blocks {self.blocks}/{self.total_blocks}")
        if self.failed:
            parts.append(f"{self.failed} failed")
        return "  ".join(parts)

    def on_planned(self, info: dict[str, Any]) -> None:
        build, carry = len(info.get("built", [])), len(info.get("carried", []))
        ray = build and info.get("ray", True)  # else it may build in this process (pipelines/inline.py)
        then = "; starting Ray" if ray else ""
        self.line(f"read: {info['tenants']} tenant(s) in {info['seconds']:.1f}s: {build} to build, "
                  f"{carry} carried over{then}")
        if ray:
            self.status("starting Ray…", force=True)

    def on_inline(self, info: dict[str, Any]) -> None:
        self.line(f"small run: {info['tenants']} tenant(s), {info['turns']} turns to compute, built in this "
                  f"process without Ray (ray.inline_max_turns)")

    def on_tenants_start(self, info: dict[str, Any]) -> None:
        self.total_tenants, self.total_blocks = info["tenants"], info["blocks"]
        self.blocks = self.tenants = self.failed = 0
        self.started = self.now()
        self.status(self.counters(), force=True)

    def on_block(self, info: dict[str, Any]) -> None:
        self.blocks += 1
        self.status(self.counters())

    def on_tenant(self, info: dict[str, Any]) -> None:
        self.tenants += 1
        if self.verbose:
            self.line(f"  tenant {info['tenant_id']}: {info['turns']} turns -> {info['nodes']} nodes, "
                      f"{info['edges']} edges in {info['seconds']:.1f}s")
            if info.get("llm"):
                self.line(f"    llm: {', '.join(f'{k} {v}' for k, v in info['llm'].items())}")
        self.status(self.counters())

    def on_tenant_failed(self, info: dict[str, Any]) -> None:
        self.tenants += 1
        self.failed += 1
        self.line(f"  tenant {info['tenant_id']} FAILED: {info['error']}")

    def on_phase(self, info: dict[str, Any]) -> None:
        name, seconds = info["name"], info["seconds"]
        if name == "tenants":
            self.line(f"tenants: {self.counters()}  in {seconds:.1f}s")
        elif name in PHASE_WORDS:
            self.line(f"{PHASE_WORDS[name]}: {seconds:.1f}s")
            if name == "ray_start":
                self.status("starting the tenants' actors…", force=True)
        if name == "tenants" or name == "write":
            self.status(f"{'writing' if name == 'tenants' else 'indexing'}…", force=True)

    def on_embed(self, info: dict[str, Any]) -> None:
        self.line(f"embed: {info['backend']}, the embedder {info['store']} was built with (name another with "
                  f"--set embed.backend=… to rebuild it in that one)")

    def on_plan(self, info: dict[str, Any]) -> None:
        self.line("plan: " + ", ".join(f"{k} {len(v)}" for k, v in info.items()))

    def on_kept_damaged(self, info: dict[str, Any]) -> None:
        self.line(f"kept session block {info['block']} is damaged ({info['reason']}): dropped, its sessions "
                  f"are computed again")

    def on_lance_damaged(self, info: dict[str, Any]) -> None:
        self.line(f"the published lance {info['table']} table's index files are damaged ({info['reason']}): "
                  f"indexed anew")

    def on_unchanged(self, info: dict[str, Any]) -> None:
        self.line(f"unchanged: the input is what {info['version']} of {info['store']} was built from; "
                  f"no new version published")

    def on_published(self, info: dict[str, Any]) -> None:
        self.line(f"published {info['version']} to {info['store']}")
        for tenant, reason in (info.get("failed") or {}).items():
            self.line(f"  FAILED tenant {tenant}: {reason}")
        removed = info.get("removed") or {}
        for tenant, reason in removed.items():
            self.line(f"  REMOVED tenant {tenant}: {reason}")
        deleted = [t for t in info.get("deleted") or [] if t not in removed]
        if deleted:
            more = ", …" if len(deleted) > 20 else ""
            self.line(f"  deleted {len(deleted)} tenant(s): {', '.join(deleted[:20])}{more}")
        kept = info.get("missing_kept") or []
        if kept:
            self.line(f"  kept {len(kept)} tenant(s) missing from the input as published ({', '.join(kept[:10])}"
                      f"{', …' if len(kept) > 10 else ''}): forget with --delete, or pass --input-is-complete")


class CountProgress(Display):
    """The eval's questions per strategy: a redrawn counter on a terminal, one line per strategy
    when it is done (``progress(name, done, total)`` of :func:`memlib.eval.runner.evaluate`)."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.name: str | None = None
        self.started = self.ended = self.now()  # a strategy starts where the one before ended

    def __call__(self, name: str, done: int, total: int) -> None:
        if name != self.name:
            self.name, self.started = name, self.ended
        text = format_count(name, done, total, self.now() - self.started)
        if done >= total:
            self.ended = self.now()
            self.line(f"  {text}  in {self.ended - self.started:.1f}s")
        else:
            self.status(f"  {text}")
