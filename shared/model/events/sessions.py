"""Events of the session aggregate (``gt.evt.session.<id>``): one polecat session working one bead.

``session.requested`` is stored before tmux is asked to start anything and ``session.started`` after the
pane's process is there, so every crash in between is recognisable on restart.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from shared.model.events.base import Event

SessionStatus = Literal["requested", "started", "ended"]
SESSION_STATUSES: tuple[SessionStatus, ...] = ("requested", "started", "ended")
"""A session's statuses in order: requested (stored before tmux starts anything), started (its pane runs), ended."""
ACTIVE_SESSION: tuple[SessionStatus, ...] = ("requested", "started")
"""Not ended: the session holds a polecat, a worktree and its bead's hook."""

END_REASONS = (
    "done",
    "handoff",
    "dead",
    "zombie",
    "stalled",
    "failed_to_start",
    "bead_closed",
    "stopped",
    "unslung",
    "agent_unauthorized",
    "gate_wait",
)
DEATHS = frozenset({"dead", "zombie", "stalled", "failed_to_start"})
"""End reasons that count against a bead's respawn limit (a done, a handoff, a stop or an unsling is no death)."""
WARRANT_REASONS = (
    "dead", "zombie", "stalled", "stuck_in_done", "bead_closed", "stopped", "unslung", "agent_unauthorized",
    "gate_wait",
)  # fmt: skip
"""Why the witness files a warrant. ``stuck_in_done`` ends as ``done``: the witness finishes the done flow;
``unslung`` (an operator released the bead's hook) ends as ``unslung``, which like ``bead_closed`` and
``stopped`` is no death. ``agent_unauthorized`` (the model API refused the agent's credentials: the rig is
parked, the operator told) is none either: the bead is not at fault. ``gate_wait`` (its current step waits on its
gate and the agent went quiet) is none: a fresh session comes when the gate opens."""


class SessionEvent(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "session"
    session_id: str

    def aggregate_id(self) -> str:
        return self.session_id


class SessionRequested(SessionEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "session.requested"
    rig: str
    polecat: str
    bead: str
    worktree: str
    branch: str
    tmux_name: str
    attempt: int
    """1 for the bead's first session, then one more for each respawn or handoff."""
    handoff_of: str | None = None
    agent: str = ""
    """What it runs: the runtime its bead was slung with (``bead.slung``'s ``agent``), else the rig's ``agent_command``
    when it was requested (a runtime's name or a command line). The session keeps it when the rig changes runtime
    (``gt rig update --agent``); empty in older logs (the rig's, then)."""


class SessionStarted(SessionEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "session.started"
    pane_pid: int
    pid_started: float
    """The pane process's start time: with the pid it names the process (pids are reused)."""
    adopted: bool = False
    """Found running after a witness crash, not started by this witness process."""


class SessionDoneIntent(SessionEvent, frozen=True, kw_only=True):
    """``gt done`` began: a death from now on is finished by the witness, not treated as a crash."""

    TYPE: ClassVar[str] = "session.done_intent"


class SessionWarranted(SessionEvent, frozen=True, kw_only=True):
    """The session is to be killed; the witness re-verifies the process right before it does."""

    TYPE: ClassVar[str] = "session.warranted"
    reason: str
    detail: str = ""
    pane_tail: str = ""
    """The last lines its pane showed when it was warranted (bounded, control characters removed; empty when
    the pane was gone): what a later session's ``gt prime`` shows of it."""


class SessionEnded(SessionEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "session.ended"
    reason: str
    """One of ``END_REASONS``. ``stopped``: the operator stopped it (``gt down --sessions``); its bead gets a
    fresh session from the next witness (the next ``gt up``), not from the one that stopped it."""
    detail: str = ""


class SessionCleaned(SessionEvent, frozen=True, kw_only=True):
    """After a finished session: its worktree removed (or kept, with the reason), its polecat name free."""

    TYPE: ClassVar[str] = "session.cleaned"
    worktree_removed: bool
    detail: str = ""
    pane_tail: str = ""
    """The last lines its pane showed before the witness ended it, when no warrant recorded them: an agent that
    stayed at its prompt after ``gt done`` (its last words), or one that exited (its last output)."""
    transcript_tail: str = ""
    """The last entries of the transcript its runtime kept (``shared.model.transcripts``: what the agent said, the
    tools it called and what they answered), one per line; empty when its runtime keeps none or it wrote none."""


class SessionEscalated(SessionEvent, frozen=True, kw_only=True):
    """The bead will not be respawned by the witness (respawn limit, or a worktree it cannot reuse)."""

    TYPE: ClassVar[str] = "session.escalated"
    reason: str


class SessionHookRecovered(SessionEvent, frozen=True, kw_only=True):
    """The bead's hook went stale after this session (its lease lapsed ``token``, nobody took it): the witness
    re-slings the bead (``resling``) or escalates it (``escalate``)."""

    TYPE: ClassVar[str] = "session.hook_recovered"
    bead: str
    token: int
    resolution: str
    detail: str = ""


SESSION_EVENTS: tuple[type[Event], ...] = (
    SessionRequested,
    SessionStarted,
    SessionDoneIntent,
    SessionWarranted,
    SessionEnded,
    SessionCleaned,
    SessionEscalated,
    SessionHookRecovered,
)
