"""What the witness can be owed to do, as plain values: the planner returns them, the executor carries them out.

Every action has a ``key``: two actions with the same key never run at once (one per session, bead, tmux
session, nudge or rig), so a slow action is never started a second time by the next patrol.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec


class Action(msgspec.Struct, frozen=True, kw_only=True):
    PRIORITY: ClassVar[int] = 5
    """Lower runs first: killing and restarting before cleaning up."""
    KEY: ClassVar[tuple[str, str]]
    """What the action is one-at-a-time for: a kind, and the field naming the one of that kind."""

    @property
    def key(self) -> str:
        kind, field = self.KEY
        return f"{kind}:{getattr(self, field)}"


class SessionAction(Action, frozen=True, kw_only=True):
    KEY = ("session", "session")
    session: str


class Spawn(Action, frozen=True, kw_only=True):
    """Record ``session.requested`` for a bead that needs a session (after re-slinging it), then start it."""

    PRIORITY: ClassVar[int] = 1
    KEY = ("bead", "bead")
    bead: str
    session: str
    rig: str
    polecat: str
    worktree: str
    branch: str
    tmux_name: str
    attempt: int
    agent: str
    """What the session runs (``state.agent_for``: the bead's slung runtime, else the rig's ``agent_command``)."""
    handoff_of: str | None = None
    resling: bool = False
    """Move the bead's hook to the new session first (after a death; a handoff keeps the hook)."""


class Start(SessionAction, frozen=True, kw_only=True):
    """Start (or adopt) the tmux session of a requested session."""

    PRIORITY: ClassVar[int] = 1


class GiveUp(SessionAction, frozen=True, kw_only=True):
    """A requested session that would not start: end it (``failed_to_start``)."""

    PRIORITY: ClassVar[int] = 1
    detail: str


class Warrant(SessionAction, frozen=True, kw_only=True):
    """Record why the session must go, then kill it (re-verified) and end it."""

    PRIORITY: ClassVar[int] = 0
    reason: str
    detail: str = ""
    escalate: bool = False
    """Escalate first (naming rig, bead and session, with what the pane shows) and mark the session escalated, so
    its bead is not respawned into what stopped it: its agent waits at a screen nobody will answer."""


class Kill(SessionAction, frozen=True, kw_only=True):
    """Carry out a recorded warrant: re-verify, kill, end (finishing the done flow if it had begun)."""

    PRIORITY: ClassVar[int] = 0


class Escalate(SessionAction, frozen=True, kw_only=True):
    """The bead of this (ended) session is not respawned: ask a person."""

    PRIORITY: ClassVar[int] = 3
    reason: str
    message: str


class Clean(SessionAction, frozen=True, kw_only=True):
    """After a session ended: reap its tmux leftovers and, with ``remove_worktree``, give up its worktree (only if
    nothing unsaved is in it); then record ``session.cleaned``."""

    PRIORITY: ClassVar[int] = 3
    remove_worktree: bool
    """Give the worktree up: kept for the polecat's next bead (released), or removed with ``delete``."""
    delete: bool = False
    """Removed from the disk, not kept for reuse (the operator asked: `gt unsling --remove-worktree`)."""
    detail: str = ""
    again: bool = False
    """Cleaned already with its worktree kept, and its bead closed since: try removing the worktree once more."""


class ReapPane(SessionAction, frozen=True, kw_only=True):
    """An ended session's tmux session is still there (a dead pane, or an agent that did not exit)."""

    PRIORITY: ClassVar[int] = 2


class KillOrphan(Action, frozen=True, kw_only=True):
    """A tmux session on our server that no session of ours accounts for, old enough to be no starting agent."""

    PRIORITY: ClassVar[int] = 4
    KEY = ("tmux", "tmux_name")
    tmux_name: str
    pane_pid: int
    created: int


class MassDeath(Action, frozen=True, kw_only=True):
    PRIORITY: ClassVar[int] = 3
    KEY = ("rig", "rig")
    rig: str
    sessions: tuple[str, ...]
    window_s: float


class DeliverNudge(Action, frozen=True, kw_only=True):
    PRIORITY: ClassVar[int] = 2
    KEY = ("nudge", "nudge")
    nudge: str
    session: str


class ContinueSession(Action, frozen=True, kw_only=True):
    """A session whose agent restarted with a fresh context (``/clear``, a compaction) and waits at its prompt:
    queue the one nudge that sends it on with its current step (once per such start)."""

    PRIORITY: ClassVar[int] = 2
    KEY = ("continue", "session")
    session: str
    number: int
    """Which start of the session it was (its hook log), part of the nudge's id."""
    source: str


class WarnContext(Action, frozen=True, kw_only=True):
    """A session whose conversation passed a share of its model's context window (``GT_CONTEXT_HANDOFF``): queue
    the one nudge that tells it to hand off (once per share)."""

    PRIORITY: ClassVar[int] = 2
    KEY = ("context", "session")
    session: str
    share: float
    """The share it passed, part of the nudge's id."""
    used: int
    """Percent of the window its newest answer's request carried."""


class NudgeMail(Action, frozen=True, kw_only=True):
    """Unread mail for a polecat whose session is live: queue the one nudge that tells it (once per message)."""

    PRIORITY: ClassVar[int] = 2
    KEY = ("mail", "message")
    message: str


class ExpireNudge(Action, frozen=True, kw_only=True):
    PRIORITY: ClassVar[int] = 4
    KEY = ("nudge", "nudge")
    nudge: str
    reason: str = "ttl"
    """``ttl``: it waited its time out; ``bead_closed``: the bead it was about is closed."""


class ClaimBead(SessionAction, frozen=True, kw_only=True):
    """A started session's bead is still ``hooked``: claim it for the session's polecat (``in_progress``, assignee
    ``<rig>/<polecat>``), fenced by the session's hook lease, so every agent shows who works its bead, whatever it
    runs. The witness's, after ``session.started``: nothing of it runs beside the agent's own start."""

    KEY = ("claim", "session")
    PRIORITY: ClassVar[int] = 4
    bead: str


class ReleaseHook(SessionAction, frozen=True, kw_only=True):
    """An ended session still holds its bead's hook lease: release it, so the deacon does not expire it and
    a stale-hook sweep sees the hook free."""

    PRIORITY: ClassVar[int] = 6
    bead: str


class Resling(Action, frozen=True, kw_only=True):
    """A stale hook the witness decided to re-sling: ask the mayor to sling the bead again (forced) to its rig;
    the fresh sling then gets a session like any other."""

    PRIORITY: ClassVar[int] = 1
    KEY = ("bead", "bead")
    bead: str
    rig: str
    after: str
    """The session after which the hook went stale (names the command, so a resend is harmless)."""


class TownAgentAction(Action, frozen=True, kw_only=True):
    """Something owed to a town agent's session (docs/mayor-agent.md): one at a time per agent."""

    KEY = ("town-agent", "name")
    name: str


class LaunchTownAgent(TownAgentAction, frozen=True, kw_only=True):
    """The town agent is wanted and no session of it runs: launch run ``run`` (its pane, workspace and identity),
    then record ``town_agent.launched``."""

    PRIORITY: ClassVar[int] = 1
    run: int


class EndTownAgent(TownAgentAction, frozen=True, kw_only=True):
    """The town agent was stopped and its pane is still there: end it (the agent and all it started)."""

    PRIORITY: ClassVar[int] = 0


class DeliverAsk(TownAgentAction, frozen=True, kw_only=True):
    """The agent is at its prompt and a request waits: type it in, then record ``town_agent.ask_delivered``."""

    PRIORITY: ClassVar[int] = 2
    ask: str
    run: int
    again: bool = False
    """Typed already, and its runtime did not take it in: send it (again)."""


class TellTownAgent(TownAgentAction, frozen=True, kw_only=True):
    """The agent waits at its prompt with no request of its own: type in a notice (mail to it, an escalation), then
    record ``town_agent.told``."""

    PRIORITY: ClassVar[int] = 3
    notice: str
    run: int


class RecordAnswer(TownAgentAction, frozen=True, kw_only=True):
    """The agent ended the turn a request began: record its last words as the answer (``town_agent.answered``)."""

    PRIORITY: ClassVar[int] = 2
    ask: str
    text: str


class CrewAction(Action, frozen=True, kw_only=True):
    """Something owed to a crew member's workspace (docs/crew.md): one at a time per member."""

    KEY = ("crew", "crew")
    crew: str
    """``crew_key``: ``<rig>-<name>``."""
    rig: str


class MakeCrewWorkspace(CrewAction, frozen=True, kw_only=True):
    """A crew member was added and its workspace is not there yet: make it, then record ``crew.ready``."""

    PRIORITY: ClassVar[int] = 3


class RemoveCrewWorkspace(CrewAction, frozen=True, kw_only=True):
    """A crew member was removed: remove its workspace (kept if work was found in it since), then record
    ``crew.workspace_removed``."""

    PRIORITY: ClassVar[int] = 6
