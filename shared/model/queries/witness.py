"""Queries the witness answers (``gt.q.witness.<name>``): rigs, sessions, nudges, each answered with the witness's
records (``shared.model.rigs``, ``shared.model.sessions``) or views that extend them."""

from __future__ import annotations

from typing import Any, ClassVar

from shared.model.crew import Crew
from shared.model.queries.base import Query, R, Required, ServiceStatus
from shared.model.rigs import RigView
from shared.model.sessions import Nudge, SessionDetail, SessionView


class WitnessQuery(Query[R], frozen=True, kw_only=True):
    """A query the witness answers (``gt.q.witness.<name>``)."""

    SERVICE: ClassVar[str] = "witness"


class WitnessStatus(ServiceStatus, kw_only=True):
    """The witness's ``status``: its action queue, the processes it watches, and the session logins it answered."""

    actions_done: int = 0
    action_errors: int = 0
    actions_pending: int = 0
    watched_processes: int = 0
    tmux_socket: str = ""
    rigs: list[str] | None = None
    """The rigs this instance's scope serves (None: every rig)."""
    commands_passed: int = 0
    """Commands of another instance's scope it let pass."""
    session_logins_granted: int | None = None
    """None: this instance answers no session logins (auth callout off)."""
    session_logins_refused: int | None = None
    session_connections_kicked: int | None = None


class Rigs(WitnessQuery[list[RigView]], frozen=True, kw_only=True):
    """Rigs in service (every one, removed ones too, with ``all``)."""

    NAME: ClassVar[str] = "rigs"
    all: bool = False


class Rig(WitnessQuery[RigView], frozen=True, kw_only=True):
    NAME: ClassVar[str] = "rig"
    name: Required


class Sessions(WitnessQuery[list[SessionView]], frozen=True, kw_only=True):
    """Active sessions (every one with ``all``), of one rig or bead when given."""

    NAME: ClassVar[str] = "sessions"
    rig: str | None = None
    bead: str | None = None
    all: bool = False


class Session(WitnessQuery[SessionDetail], frozen=True, kw_only=True):
    """One session (a polecat session may ask about its own only)."""

    NAME: ClassVar[str] = "session"
    id: Required


class Nudges(WitnessQuery[list[Nudge]], frozen=True, kw_only=True):
    """Queued nudges (every one with ``all``)."""

    NAME: ClassVar[str] = "nudges"
    all: bool = False


class CrewList(WitnessQuery[list[Crew]], frozen=True, kw_only=True):
    """Crew members (of one rig when given), removed ones whose workspace was kept too."""

    NAME: ClassVar[str] = "crew"
    rig: str | None = None


QUERIES: tuple[type[Query[Any]], ...] = (Rigs, Rig, Sessions, Session, Nudges, CrewList)
"""What the witness answers (besides ``status`` and ``digest``)."""
