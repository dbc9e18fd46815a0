"""The text an MCP tool returns: what an agent pastes into its model's context. One line per
turn, each carrying its provenance (turn id, session, session date, the memory node that found
it), so the answering model can cite and date what it uses."""
from __future__ import annotations

from datetime import datetime

from memlib.retrieve.event_time import format_event
from memlib.serve.models import SearchResponse, SessionResponse, TenantsResponse

VIA_CHARS = 160


def _date(iso: str | None) -> str:
    if not iso:
        return "date unknown"
    try:
        return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return iso


def _parsed(iso: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(iso) if iso else None
    except ValueError:
        return None


def _said(speaker: str | None, text: str) -> str:
    return f"{speaker}: {text}" if speaker else text


def pack_search(resp: SearchResponse) -> str:
    """``[rank] date · session · turn · speaker: text`` per ranked turn (``· event 2023-05-03`` before
    the speaker when the turn tells of an event the build dated on another day than its session),
    and the node that cited the turn when it is not the turn itself (a fact, an event, a segment ...)."""
    nodes = {n.node_id: n for n in resp.results}
    n = len(resp.turns)
    head = (f"Memory of tenant {resp.tenant} for {resp.query!r}: {n} turn{'' if n == 1 else 's'}, best first "
            f"(strategy {resp.strategy}, store {resp.version}).")
    if not resp.turns:
        return head + "\nNothing in memory matched."
    lines = [head]
    for rank, turn in enumerate(resp.turns, start=1):
        via = nodes.get(turn.via)
        # the date of the event the turn tells of, when the build resolved one on another day
        event = format_event(via.signals, _parsed(turn.time)) if via is not None and via.node_id == turn.node_id else ""
        line = f"[{rank}] {_date(turn.time)} · session {turn.session_id} · turn {turn.turn_id} · " \
               f"{event + ' · ' if event else ''}{_said(turn.speaker, turn.text)}"
        if via is not None and via.kind != "turn":
            text = via.text if len(via.text) <= VIA_CHARS else via.text[:VIA_CHARS - 1] + "…"
            line += f"\n    (found through {via.kind} {via.node_id}: {text})"
        lines.append(line)
    return "\n".join(lines)


def pack_session(resp: SessionResponse) -> str:
    """The session's turns in order, ``>`` marking the turn the window is centred on."""
    if resp.turns:
        span = f"turns {resp.turns[0].position + 1}-{resp.turns[-1].position + 1} of {resp.n_turns}"
    else:
        span = f"0 of {resp.n_turns} turns"
    lines = [f"Session {resp.session_id} of tenant {resp.tenant}, {_date(resp.time)} ({span}, store {resp.version})."]
    for t in resp.turns:
        mark = ">" if t.node_id == resp.focus else " "
        lines.append(f"{mark} {t.turn_id} · {_said(t.speaker, t.text)}")
    return "\n".join(lines)


def pack_tenants(resp: TenantsResponse) -> str:
    if not resp.tenants:
        return f"No tenant is visible to this connection (store {resp.version})."
    return f"Tenants this connection may search (store {resp.version}): {', '.join(resp.tenants)}"
