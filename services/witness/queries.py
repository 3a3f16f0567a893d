"""Answers to ``gt.q.witness.<name>``, a query decoded into its class (``shared.model.queries.witness``), read from the
projection. Pure."""

from __future__ import annotations

from typing import Any

import msgspec

from services.witness.decide import waiting_beads
from services.witness.state import Nudge, Session, WitnessState
from shared.core.errors import QueryError
from shared.model.events.sessions import ACTIVE_SESSION
from shared.model.queries import witness
from shared.model.queries.base import Query
from shared.model.rigs import RigView
from shared.model.sessions import EarlierSession, SessionDetail, SessionView

EARLIER_SESSIONS_SHOWN = 3
"""How many of a bead's earlier sessions ``gt prime`` tells a fresh session about (newest first)."""


def session_view(state: WitnessState, session: Session) -> SessionView:
    bead = state.beads.get(session.bead)
    return SessionView(
        **msgspec.structs.asdict(session),
        bead_status=bead.status if bead else None,
        merge_failure=bead.merge_failure if bead else None,
        current=bead is not None and bead.sessions[-1:] == [session.id],
    )


def _rigs(state: WitnessState, everything: bool) -> list[RigView]:
    """Rigs in service (every one, removed too, with ``everything``)."""
    return [
        RigView(
            **msgspec.structs.asdict(rig),
            active_sessions=sum(1 for s in state.sessions.values() if s.rig == rig.name and s.status in ACTIVE_SESSION),
            waiting_beads=waiting_beads(state, rig.name),
        )
        for rig in state.rigs.values()
        if everything or not rig.removed
    ]


def _rig(state: WitnessState, name: str) -> RigView:
    for view in _rigs(state, everything=True):
        if view.name == name:
            return view
    raise QueryError("not_found", f"no rig {name!r} (`gt rig list` shows them)")


def _sessions(state: WitnessState, query: witness.Sessions) -> list[SessionView]:
    """Active sessions (every one with ``all``), optionally of one rig or bead."""
    out = []
    for session in state.sessions.values():
        if query.rig is not None and session.rig != query.rig:
            continue
        if query.bead is not None and session.bead != query.bead:
            continue
        if not query.all and session.status not in ACTIVE_SESSION:
            continue
        out.append(session_view(state, session))
    return out


def check_session_query(state: WitnessState, query: Query[Any], session: str) -> None:
    """A polecat session reads only its own bead's sessions: its own record, and the list of its bead's sessions
    (``bead`` named: the earlier ones' handoff notes are its context). Not another session's record or the whole
    list (a red team read another session's handoff note and pane through ``sessions all``), and no nudge list
    (what the operator typed into other panes). Raises ``QueryError`` ``unauthorized`` otherwise."""
    match query:
        case witness.Session(id=asked) if asked != session:
            raise QueryError("unauthorized", f"session {session} reads only its own session record")
        case witness.Sessions(bead=bead):
            own = state.sessions.get(session)
            if own is None or bead != own.bead:
                mine = own.bead if own is not None else "its bead"
                raise QueryError("unauthorized", f"session {session} lists only its own bead's sessions (bead {mine})")
        case witness.Nudges():
            raise QueryError("unauthorized", f"session {session} reads no nudges but those typed into its own pane")
        case witness.CrewList():
            raise QueryError("unauthorized", f"session {session} reads no crew list (the operator's)")


def _session(state: WitnessState, session_id: str) -> SessionDetail:
    session = state.sessions.get(session_id)
    if session is None:
        raise QueryError("not_found", f"no session {session_id!r} (`gt session list` shows them)")
    bead = state.beads.get(session.bead)
    siblings = bead.sessions if bead is not None else []
    return SessionDetail(
        **msgspec.structs.asdict(session_view(state, session)),
        rig_config=state.rigs.get(session.rig),
        later_sessions=siblings[siblings.index(session.id) + 1 :] if session.id in siblings else [],
        earlier_sessions=earlier_sessions(state, session, siblings),
        nudges=[
            n
            for n in state.nudges.values()
            if n.delivered_to == session.id
            or (n.status == "queued" and n.rig == session.rig and n.polecat == session.polecat)
        ],
    )


def earlier_sessions(state: WitnessState, session: Session, siblings: list[str]) -> list[EarlierSession]:
    """How the bead's sessions before ``session`` ended, newest first (a few): a handoff's note, a warrant's
    reason and the pane's last lines, as the log recorded them."""
    before = siblings[: siblings.index(session.id)] if session.id in siblings else []
    out = []
    for session_id in reversed(before[-EARLIER_SESSIONS_SHOWN:]):
        earlier = state.sessions.get(session_id)
        if earlier is None:
            continue
        out.append(
            EarlierSession(
                id=earlier.id,
                attempt=earlier.attempt,
                polecat=earlier.polecat,
                status=earlier.status,
                end_reason=earlier.end_reason,
                end_detail=earlier.end_detail,
                warrant_reason=earlier.warrant_reason,
                warrant_detail=earlier.warrant_detail,
                pane_tail=earlier.pane_tail,
                ended_at=earlier.ended_at.isoformat() if earlier.ended_at else None,
            )
        )
    return out


def _nudges(state: WitnessState, everything: bool) -> list[Nudge]:
    return [n for n in state.nudges.values() if everything or n.status == "queued"]


def answer(state: WitnessState, query: Query[Any]) -> Any:
    match query:
        case witness.Rigs():
            return _rigs(state, query.all)
        case witness.Rig():
            return _rig(state, query.name)
        case witness.Sessions():
            return _sessions(state, query)
        case witness.Session():
            return _session(state, query.id)
        case witness.Nudges():
            return _nudges(state, query.all)
        case witness.CrewList():
            return [c for c in state.crews.values() if query.rig in (None, c.rig) and not c.gone]
    raise QueryError("unknown_query", f"the witness answers no {query.NAME!r}")
