"""What the witness observed (tmux, processes, heartbeats, its runtimes' files and screens) as the planner reads it:
``Observed``, made by ``effects/observe.py`` before each plan."""

from __future__ import annotations

from datetime import datetime

import msgspec

from services.witness.state import Session
from shared.model.runtimes import Restart


class PaneSeen(msgspec.Struct, frozen=True, kw_only=True):
    """One tmux session on the witness's tmux server, as observed."""

    name: str
    pane_pid: int
    dead: bool
    created: int
    """Seconds since the epoch."""
    label: str = ""
    """The session id it was started for (empty: not started by a witness)."""
    activity: int = 0
    """tmux's last output or input in the session (seconds since the epoch; 0: unknown)."""


class TownAgentSeen(msgspec.Struct, frozen=True, kw_only=True):
    """What the witness saw of a town agent's session at a patrol."""

    pane: bool = False
    """Its tmux session is there (alive or not)."""
    alive: bool = False
    """Its pane's process runs."""
    idle: bool = False
    """Its runtime shows its prompt with no turn running."""
    answer: str | None = None
    """The last words of the turn the request delivered to this run began, once that turn ended (its transcript)."""
    received: bool = True
    """The request delivered to this run is in its transcript (False: typed, but its runtime did not take it in)."""


class Observed(msgspec.Struct, frozen=True, kw_only=True):
    now: datetime
    as_of_seq: int
    """The projection's sequence when observing began: sessions that changed later are judged next time."""
    panes: dict[str, PaneSeen] | None
    """By tmux session name; None when tmux could not be asked (then nothing is judged dead)."""
    alive: dict[str, bool] = {}
    """Session id -> its recorded pane process (pid and start time) still runs."""
    heartbeats: dict[str, datetime] = {}
    activity: dict[str, datetime] = {}
    """Session id -> its agent runtime's last activity seen in files (a tool-call hook's mark, its transcript) or
    on its screen (a retry status that changed since the last look: ``Runtime.activity_on_screen``)."""
    start_confirmed: frozenset[str] = frozenset()
    """Started sessions whose agent runtime confirmed its start (Claude Code's SessionStart hook ran)."""
    refused: dict[str, str] = {}
    """Started sessions whose agent recorded that the model API refused its credentials: why."""
    blocked: dict[str, str] = {}
    """Started sessions not confirmed yet whose pane shows a screen waiting for input (``Runtime.blocking_screen``):
    what it is."""
    idle: frozenset[str] = frozenset()
    """Started sessions whose runtime says they wait for input (``Runtime.idle``)."""
    restarts: dict[str, Restart] = {}
    """Idle sessions whose agent's newest start was a restart with a fresh context (``Runtime.restart``)."""
    reported_done: frozenset[str] = frozenset()
    """Sessions ended by `gt done` whose agent ended a turn since (``runtimes.turn_ended_after_done``): it has read
    what `gt done` said, so the grace (``done_exit_grace_s``) is not waited out."""
    start_failures: dict[str, int] = {}
    busy: frozenset[str] = frozenset()
    """Keys of actions still running."""
    reserved: frozenset[tuple[str, str]] = frozenset()
    """(rig, polecat) names taken by spawns still running."""
    town_agents: dict[str, TownAgentSeen] = {}
    """Town agent name -> what its session showed (only a witness of every rig looks)."""
    acting_since: datetime | None = None
    """When this witness process began acting: a session the operator stopped since then is not respawned by
    it (the town is going down); the next witness respawns it."""


def pane_of(session: Session, obs: Observed) -> PaneSeen | None:
    """The tmux session running ``session``, if it is there (a same-named one for another session is not)."""
    if obs.panes is None:
        return None
    pane = obs.panes.get(session.tmux_name)
    return pane if pane is not None and pane.label == session.id else None
