"""What the dashboard shows, folded from the log. Pure: events in, a JSON-ready view out.

The dashboard keeps its own projection, rebuilt by replaying the log when it starts (like every service), so
it needs nothing from the services to draw convoys, polecats, the merge queue, escalations and the feed; a
restarted dashboard draws the same page. Sequences it has seen are skipped. The gate runners and the merge figures
are the refinery's board (``gt.q.refinery.board``), handed in as it last answered.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import msgspec

from gt.narration import bead_of, describe
from shared.core.errors import EventDecodeError
from shared.model.events import decode_envelope
from shared.model.events.merge_requests import MR_OPEN
from shared.model.events.sessions import SessionStatus
from shared.model.queries.refinery import MqBoard

RECENT_EVENTS = 300
RECENT_SESSIONS = 30
RECENT_CLOSED_CONVOYS = 5
"""Closed convoys the page lists, the most recently closed: the others are counted (``gt convoy list --all``)."""
SessionState: TypeAlias = SessionStatus | Literal["finishing", "warranted"]
"""What the page shows of a session: its status, and the two phases before it ends (``gt done`` began; the witness
condemned it)."""
_DATA = msgspec.json.Decoder(dict[str, Any])


@dataclass
class Session:
    id: str
    bead: str
    rig: str
    polecat: str
    attempt: int
    state: SessionState = "requested"
    """requested -> started -> (finishing) -> ended; warranted in between when the witness condemned it."""
    warrant: str | None = None
    end_reason: str | None = None
    since: str = ""
    tokens: int = 0
    """Tokens used so far (``session.usage``: running totals, so the newest replaces what was there)."""


@dataclass
class DashboardState:
    last_seq: int = 0
    beads: dict[str, dict[str, Any]] = field(default_factory=dict)
    convoys: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Open convoys and the ``RECENT_CLOSED_CONVOYS`` last closed; older closed ones are only counted."""
    closed_convoys: deque[str] = field(default_factory=deque)
    """The closed convoys kept, oldest first."""
    older_closed_convoys: int = 0
    sessions: dict[str, Session] = field(default_factory=dict)
    ended: deque[str] = field(default_factory=lambda: deque(maxlen=RECENT_SESSIONS))
    mrs: dict[str, dict[str, Any]] = field(default_factory=dict)
    escalations: dict[str, dict[str, Any]] = field(default_factory=dict)
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECENT_EVENTS))
    undecodable: int = 0


def apply(state: DashboardState, seq: int, raw: bytes) -> dict[str, Any] | None:
    """Fold the event stored at ``seq``; returns its feed entry (None when skipped or unreadable)."""
    if seq <= state.last_seq:
        return None
    state.last_seq = seq
    try:
        env = decode_envelope(raw)
        data = _DATA.decode(env.data)
    except (EventDecodeError, msgspec.DecodeError, ValueError, RecursionError):  # see shared.core.decoding
        state.undecodable += 1
        return None
    _fold(state, env.type, data, env.ts.isoformat())
    sentence, kind = describe(env.type, data)
    rig, bead = _rig_and_bead(state, env.type, data)
    entry = {
        "seq": seq,
        "ts": env.ts.isoformat(),
        "type": env.type,
        "actor": env.actor,
        "text": sentence,
        "kind": kind,
        "bead": bead,
        "rig": rig,
    }
    state.recent.append(entry)
    return entry


def _rig_and_bead(state: DashboardState, event_type: str, data: dict[str, Any]) -> tuple[str | None, str | None]:
    bead = bead_of(event_type, data)
    rig = data.get("rig") if isinstance(data.get("rig"), str) else None
    session = state.sessions.get(str(data.get("session_id") or data.get("session") or ""))
    if session is not None:
        return rig or session.rig, bead or session.bead
    mr = state.mrs.get(str(data.get("mr_id") or ""))
    if mr is not None:
        return rig or mr["rig"], bead or mr["bead"]
    if bead and bead in state.beads:
        rig = rig or state.beads[bead].get("rig")
    return rig, bead


def _fold(state: DashboardState, t: str, d: dict[str, Any], ts: str) -> None:
    if t == "bead.created":
        state.beads[d["bead_id"]] = {"id": d["bead_id"], "title": d.get("title", ""), "status": "open", "rig": None}
    elif t == "bead.slung" and d.get("bead_id") in state.beads:
        state.beads[d["bead_id"]].update(status="hooked", rig=d.get("rig"))
    elif t == "bead.unslung" and d.get("bead_id") in state.beads:
        state.beads[d["bead_id"]].update(status="open", rig=None)
    elif t == "bead.claimed" and d.get("bead_id") in state.beads:
        state.beads[d["bead_id"]]["status"] = "in_progress"
    elif t == "bead.closed" and d.get("bead_id") in state.beads:
        state.beads[d["bead_id"]]["status"] = "closed"
    elif t == "convoy.created":
        state.convoys[d["convoy_id"]] = {
            "id": d["convoy_id"],
            "title": d.get("title", ""),
            "beads": list(d.get("beads") or []),
            "status": "open",
        }
    elif t == "convoy.beads_added" and d.get("convoy_id") in state.convoys:
        state.convoys[d["convoy_id"]]["beads"] += [
            b for b in d.get("beads") or [] if b not in state.convoys[d["convoy_id"]]["beads"]
        ]
    elif t == "convoy.closed" and d.get("convoy_id") in state.convoys:
        state.convoys[d["convoy_id"]]["status"] = "closed"
        state.closed_convoys.append(d["convoy_id"])
        # A long-lived town closes convoys for ever: the page lists the last few and counts the rest.
        while len(state.closed_convoys) > RECENT_CLOSED_CONVOYS:
            del state.convoys[state.closed_convoys.popleft()]
            state.older_closed_convoys += 1
    elif t.startswith("session."):
        _fold_session(state, t, d, ts)
    elif t.startswith("mr."):
        _fold_mr(state, t, d)
    elif t.startswith("escalation."):
        _fold_escalation(state, t, d)


def _fold_session(state: DashboardState, t: str, d: dict[str, Any], ts: str) -> None:
    sid = str(d.get("session_id"))
    if t == "session.requested":
        state.sessions[sid] = Session(
            id=sid,
            bead=str(d.get("bead")),
            rig=str(d.get("rig")),
            polecat=str(d.get("polecat")),
            attempt=int(d.get("attempt") or 1),
            since=ts,
        )
        return
    session = state.sessions.get(sid)
    if session is None:
        return
    if t == "session.usage":
        session.tokens = _usage_tokens(d)
    elif t == "session.started" and session.state == "requested":
        session.state, session.since = "started", ts
    elif t == "session.done_intent" and session.state == "started":
        session.state, session.since = "finishing", ts
    elif t == "session.warranted" and session.state != "ended":
        session.state, session.warrant, session.since = "warranted", str(d.get("reason")), ts
    elif t == "session.ended":
        session.state, session.end_reason, session.since = "ended", str(d.get("reason")), ts
        state.ended.append(sid)
        # Keep the ended ones the page shows; the rest would grow without bound over a long log.
        keep = set(state.ended)
        for old in [s for s, v in state.sessions.items() if v.state == "ended" and s not in keep]:
            del state.sessions[old]


def _usage_tokens(d: dict[str, Any]) -> int:
    fields = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    models = [m for m in d.get("models") or [] if isinstance(m, dict)]
    return sum(int(m.get(f) or 0) for m in models for f in fields)


def _fold_mr(state: DashboardState, t: str, d: dict[str, Any]) -> None:
    mid = str(d.get("mr_id"))
    if t == "mr.submitted":
        state.mrs[mid] = {"id": mid, "bead": d.get("bead"), "rig": d.get("rig"), "status": "queued", "attempts": 0}
        return
    mr = state.mrs.get(mid)
    if mr is None:
        return
    status = {
        "mr.claimed": "claimed",
        "mr.merged": "merged",
        "mr.failed": "escalated" if d.get("escalated") else "failed",
        "mr.conflicted": "conflicted" if d.get("sent_back") else "blocked",
        "mr.requeued": "queued",
        "mr.rejected": "rejected",
    }.get(t)
    if status is not None:
        mr["status"] = status
    if t == "mr.claimed":
        mr["attempts"] = int(d.get("attempt") or mr["attempts"] + 1)


def _fold_escalation(state: DashboardState, t: str, d: dict[str, Any]) -> None:
    eid = str(d.get("escalation_id"))
    if t == "escalation.raised":
        state.escalations[eid] = {
            "id": eid,
            "severity": d.get("severity"),
            "message": d.get("message", ""),
            "bead": d.get("bead"),
            "source": d.get("source"),
            "status": "open",
        }
        return
    escalation = state.escalations.get(eid)
    if escalation is None:
        return
    if t == "escalation.acked":
        escalation["status"] = "acked"
    elif t == "escalation.reescalated":
        escalation["severity"] = d.get("to_severity", escalation["severity"])
    elif t == "escalation.closed":
        escalation["status"] = "closed"


def render(state: DashboardState, board: MqBoard | None = None, board_error: str = "") -> dict[str, Any]:
    """The page's whole content, as the server sends it on every change; ``board``: the refinery's last answer to
    ``board`` (``board_error``: why there is none)."""
    convoys = []
    for c in state.convoys.values():
        beads = [state.beads.get(b, {"id": b, "status": "?"}) for b in c["beads"]]
        closed = sum(1 for b in beads if b.get("status") == "closed")
        convoys.append(
            {"id": c["id"], "title": c["title"], "status": c["status"], "closed": closed, "total": len(beads)}
        )
    recently_closed = {cid: n for n, cid in enumerate(reversed(state.closed_convoys))}
    convoys.sort(key=lambda c: (recently_closed.get(c["id"], -1), c["id"]))
    active = [s for s in state.sessions.values() if s.state != "ended"]
    by_state = Counter(s.state for s in active)
    polecats = [_session_view(s) for s in sorted(active, key=lambda s: (s.rig, s.polecat))]
    ended = [_session_view(state.sessions[s]) for s in reversed(state.ended) if s in state.sessions]
    queue: dict[str, dict[str, Any]] = {}
    for mr in state.mrs.values():
        rig = queue.setdefault(str(mr["rig"]), {"counts": Counter(), "open": []})
        rig["counts"][mr["status"]] += 1
        if mr["status"] in MR_OPEN:
            rig["open"].append(mr)
    return {
        "last_seq": state.last_seq,
        "convoys": convoys,
        "older_closed_convoys": state.older_closed_convoys,
        "polecats": {"counts": dict(by_state), "active": polecats, "ended": ended},
        "merge_queue": {r: {"counts": dict(q["counts"]), "open": q["open"]} for r, q in sorted(queue.items())},
        "escalations": [e for e in state.escalations.values() if e["status"] != "closed"],
        "events": list(state.recent),
        "gates": {"board": msgspec.to_builtins(board) if board is not None else None, "error": board_error},
    }


def _session_view(s: Session) -> dict[str, Any]:
    return {
        "id": s.id,
        "bead": s.bead,
        "rig": s.rig,
        "polecat": s.polecat,
        "attempt": s.attempt,
        "state": s.state,
        "warrant": s.warrant,
        "end_reason": s.end_reason,
        "since": s.since,
        "tokens": s.tokens,
    }
