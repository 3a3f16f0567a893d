"""A polecat session as the witness keeps it and shows it: the records of its projection (a session, a nudge, the
merge queue's last reason for sending a bead's work back), and the answers of ``gt.q.witness.sessions`` and
``session`` that extend them (``SessionView``, ``SessionDetail``). Pure data."""

from __future__ import annotations

from datetime import datetime

import msgspec

from shared.model.events.beads import BeadStatus
from shared.model.events.nudges import NudgeStatus
from shared.model.events.sessions import SessionStatus
from shared.model.rigs import Rig


class Session(msgspec.Struct, kw_only=True, gc=False):
    id: str
    rig: str
    polecat: str
    bead: str
    worktree: str
    branch: str
    tmux_name: str
    attempt: int
    handoff_of: str | None = None
    agent: str = ""
    """What it runs (``SessionRequested.agent``; empty: the rig's agent, a session from an older log)."""
    status: SessionStatus = "requested"
    """requested -> started -> ended (or requested -> ended)."""
    requested_at: datetime
    started_at: datetime | None = None
    pane_pid: int | None = None
    pid_started: float | None = None
    adopted: bool = False
    done_intent_at: datetime | None = None
    warrant_reason: str | None = None
    warrant_detail: str = ""
    pane_tail: str = ""
    """Its pane's last lines when it was warranted (``session.warranted``)."""
    transcript_tail: str = ""
    """The last entries of its runtime's transcript, recorded when it was cleaned (``session.cleaned``)."""
    warranted_at: datetime | None = None
    ended_at: datetime | None = None
    end_reason: str | None = None
    end_detail: str = ""
    """How it ended, in words; a handoff's note."""
    cleaned: bool = False
    worktree_removed: bool = False
    escalated: str | None = None
    lease_token: int | None = None
    """Its fencing token on the bead's hook lease (None: a session from before hook leases)."""
    hook_recovery: str | None = None
    """The bead's hook went stale after this session: ``resling`` or ``escalate`` (``session.hook_recovered``)."""
    hook_recovery_detail: str = ""
    steps_done: int = 0
    """Steps of its bead done while it worked it: a session that got on with the work died of no crash loop, so it
    does not make its bead's next respawn wait (``plan.respawn_due``)."""
    cleanings: int = 0
    """``session.cleaned`` events recorded for it: a worktree kept at the first is tried once more once its bead
    closed, so the polecat's name is free again (``plan._ended_sessions``)."""
    version: int = 0


class MergeFailure(msgspec.Struct, kw_only=True, gc=False):
    mr: str
    gate: str
    """A gate (setup, lint, test, branch), or ``conflict``: the branch does not rebase onto the target."""
    exit_code: int
    tail: str = ""
    files: list[str] = []
    """A conflict's conflicting files."""
    target_commit: str = ""
    """The target commit a conflict was met on: the one to rebase onto."""


class Nudge(msgspec.Struct, kw_only=True, gc=False):
    id: str
    rig: str
    polecat: str
    session: str | None = None
    bead: str | None = None
    """Delivered only to a session of this bead (``NudgeQueued.bead``)."""
    message: str
    queued_at: datetime
    expires_at: datetime
    status: NudgeStatus = "queued"
    delivered_to: str | None = None
    version: int = 0


def may_linger(session: Session) -> bool:
    """Ended by `gt done` and not cleaned up yet: its agent may still be running, reading what `gt done` said (the
    witness gives it ``GT_DONE_EXIT_GRACE`` before it ends the pane)."""
    return session.status == "ended" and session.end_reason == "done" and not session.cleaned


class SessionView(Session, kw_only=True, gc=False):
    """A session as ``sessions`` lists it: the record, and its bead as the witness knows it."""

    bead_status: BeadStatus | None = None
    """None: the witness knows no such bead (any more)."""
    merge_failure: MergeFailure | None = None
    """The merge queue's reason for sending the bead's work back, as the witness recorded it."""
    current: bool = False
    """It is the bead's latest session."""


class EarlierSession(msgspec.Struct, kw_only=True, gc=False):
    """How one of a bead's earlier sessions ended (what ``gt prime`` tells the next)."""

    id: str
    attempt: int
    polecat: str
    status: SessionStatus
    end_reason: str | None = None
    end_detail: str = ""
    warrant_reason: str | None = None
    warrant_detail: str = ""
    pane_tail: str = ""
    ended_at: str | None = None
    """ISO 8601, as Python writes it (``+00:00``)."""


class SessionDetail(SessionView, kw_only=True, gc=False):
    """One session as ``session`` shows it (``gt prime``, ``gt session show``): its rig's settings, the bead's
    sessions after it and how the ones before it ended, and its nudges."""

    rig_config: Rig | None = None
    later_sessions: list[str] = []
    earlier_sessions: list[EarlierSession] = []
    nudges: list[Nudge] = []
