"""Queries the witness answers (``gt.q.witness.<name>``): rigs, sessions, nudges. Sessions come back typed
(``SessionView``: the fields callers read); the rest as the JSON the CLI prints."""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from shared.model.events.sessions import SessionStatus
from shared.model.queries.base import Query, Required, ServiceStatus


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


class SessionView(msgspec.Struct, kw_only=True):
    """A polecat session as the witness records it (the fields callers read; ``ask_json`` has all of them)."""

    id: str
    rig: str
    polecat: str
    bead: str
    status: SessionStatus
    """requested, started or ended."""
    attempt: int = 0
    worktree: str = ""
    branch: str = ""
    tmux_name: str = ""
    pane_pid: int | None = None
    end_reason: str | None = None
    done_intent_at: str | None = None
    merge_failure: dict[str, Any] | None = None
    """The merge queue's reason for sending the bead's work back, as the witness recorded it."""


class SessionDetail(SessionView, kw_only=True):
    """One session with what ``gt prime`` tells it: its rig's settings, its nudges, how earlier ones ended."""

    rig_config: dict[str, Any] | None = None
    nudges: list[dict[str, Any]] = []
    earlier_sessions: list[dict[str, Any]] = []


class Rigs(Query[Any], frozen=True, kw_only=True):
    """Rigs in service (every one, removed ones too, with ``all``)."""

    SERVICE: ClassVar[str] = "witness"
    NAME: ClassVar[str] = "rigs"
    all: bool = False


class Rig(Query[Any], frozen=True, kw_only=True):
    SERVICE: ClassVar[str] = "witness"
    NAME: ClassVar[str] = "rig"
    name: Required


class Sessions(Query[list[SessionView]], frozen=True, kw_only=True):
    """Active sessions (every one with ``all``), of one rig or bead when given."""

    SERVICE: ClassVar[str] = "witness"
    NAME: ClassVar[str] = "sessions"
    rig: str | None = None
    bead: str | None = None
    all: bool = False


class Session(Query[SessionDetail], frozen=True, kw_only=True):
    """One session (a polecat session may ask about its own only)."""

    SERVICE: ClassVar[str] = "witness"
    NAME: ClassVar[str] = "session"
    id: Required


class Nudges(Query[Any], frozen=True, kw_only=True):
    """Queued nudges (every one with ``all``)."""

    SERVICE: ClassVar[str] = "witness"
    NAME: ClassVar[str] = "nudges"
    all: bool = False


QUERIES: tuple[type[Query[Any]], ...] = (Rigs, Rig, Sessions, Session, Nudges)
"""What the witness answers (besides ``status`` and ``digest``)."""
