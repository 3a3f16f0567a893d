"""What every job of the executor shares (``spawn``, ``stop``, ``done``, ``cleanup``, ``nudge``): the witness it
works for (``Host``, the seam the tests stand a fake witness in), tmux, the locks, where a session's files are, and
the few steps several jobs take (record an end, raise an escalation, read or stop a pane).

Every step that touches the world is preceded or followed by an event so that a crash between any two leaves a
state the planner recognises (docs/architecture.md, "Failure windows"): ``session.requested`` before tmux is
asked, ``session.started`` after the pane's process is there, ``session.warranted`` before a kill and
``session.ended`` after it. Anything killed is re-verified right before the signal.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Protocol, TypeVar

import structlog

from services.witness import plan as planning
from services.witness.effects import agent_user, clone_fetch, leftovers, transcript_read
from services.witness.settings import WitnessSettings
from services.witness.state import Session, WitnessState, agent_of
from shared.bus.auth_callout import CalloutSettings
from shared.bus.commands import StoredCommand
from shared.core.aio import KeyedLocks
from shared.core.config import TownConfig
from shared.core.errors import GastownError
from shared.host import processes
from shared.host.tmux import Tmux, TmuxError
from shared.model import done_flow
from shared.model.commands import Command, EscalationRaise
from shared.model.decision import NewEvent
from shared.model.events import SessionEnded
from shared.model.queries import Query
from shared.model.rigs import home_name
from shared.model.runtimes import runtime_for

log = structlog.get_logger(__name__)

R = TypeVar("R")

REAPER_SLACK_S = 3.0
"""A killed pane's reaper ends its session's processes within ``GT_KILL_GRACE`` (SIGTERM, then SIGKILL): the witness
waits this much longer before it kills what is left itself (the reaper among them)."""


class WorktreeUnusableError(GastownError):
    """A directory is where the session's worktree belongs but cannot serve as it (wrong branch, broken)."""


class StartBlockedError(GastownError):
    """The session's tmux name is taken by something that may not be killed yet; tried again later."""


class Host(Protocol):
    """What the executor needs of the witness service."""

    config: TownConfig
    clock: Callable[[], datetime]
    acting_since: datetime | None

    @property
    def state(self) -> WitnessState: ...

    async def append_owed(self, owed: list[NewEvent], *, causation_id: str | None = None) -> int: ...

    async def store(self, cmd: Command) -> StoredCommand: ...

    @property
    def callout(self) -> CalloutSettings | None: ...

    async def read(self, query: Query[R], /) -> R:
        """Ask ``query`` as of everything this witness applied (a ``shared.model.prime.Reader``)."""
        ...


class Toolkit:
    def __init__(self, host: Host, tmux: Tmux, settings: WitnessSettings, policy: planning.Policy) -> None:
        self.host = host
        self.tmux = tmux
        self.settings = settings
        self.policy = policy
        self.agent_user = agent_user.resolve(settings.agent_user)
        agent_user.check_reachable(self.agent_user, host.config.gt_home)
        """The OS user agents run as (``GT_AGENT_USER``), checked at start-up; None: the witness's own."""
        self.town_agent_user = agent_user.resolve_town_agents(settings.town_agent_user, self.agent_user)
        agent_user.check_reachable(self.town_agent_user, host.config.gt_home)
        """The OS user the town agents run as (``GT_TOWN_AGENT_USER``); None: the witness's own."""
        # A worktree's lock: one start, clean-up or done flow of a worktree at a time. A rig's: one git process
        # at a time that changes the rig's clone as a whole (clone, fetch, adding or removing a worktree, a push's
        # remote-tracking ref). Everything else of a session's start runs for many at once. Order: the worktree's
        # lock, then the rig's.
        self.worktree_locks = KeyedLocks()
        self.repo_locks = KeyedLocks()
        self.clone_fetches = clone_fetch.CloneFetches()
        """When each rig's clone was last fetched (under its ``repo_locks``): whether a new branch may start from it."""
        self.pane_locks = KeyedLocks()
        """A pane's: one nudge typed into it at a time, its text and its Enter as one unit (two typed at once would
        arrive as one line)."""

    # ---- paths ---------------------------------------------------------------------------------

    def rig_dir(self, rig: str) -> Path:
        """The rig's directory: its current incarnation's (``rig_state.home_name``)."""
        record = self.host.state.rigs.get(rig)
        return Path(self.policy.rigs_root) / (home_name(record) if record is not None else rig)

    def bare_repo(self, rig: str) -> Path:
        return self.rig_dir(rig) / "repo.git"

    def published_dir(self, session: Session) -> Path:
        """Where the session's `gt done` publishes its branch (``done_flow.published_dir``)."""
        return done_flow.published_dir(self.rig_dir(session.rig), session.id)

    def password_file(self, session: Session) -> Path:
        """Where the session's NATS password is (``NATS_PASSWORD_FILE``): not on the tmux command line that
        starts the agent, where ``ps`` and every process on the tmux socket could read it."""
        return self.rig_dir(session.rig) / "secrets" / f"{session.id}.nats-password"

    def launch_fifo(self, session: Session) -> Path:
        """Where the session's reaper waits for its agent's command and environment (``reaper --launch``), beside
        its password: removed by the reaper once read."""
        return self.rig_dir(session.rig) / "secrets" / f"{session.id}.launch"

    def trusted_index(self, session: Session) -> Path:
        """Where the witness keeps the index its own checkout wrote in the session's workspace, before the agent
        ran (``repository_renewal``): the witness's alone (``workspaces/`` is 0700), never the agent's to write."""
        return self.rig_dir(session.rig) / "workspaces" / f"{session.polecat}.index"

    def session_dir(self, session: Session) -> Path:
        """The session's runtime dir: an agent runtime's config home and hook marks (``GT_SESSION_DIR``)."""
        return self.rig_dir(session.rig) / "sessions" / session.id

    def base_branch(self, rig: str) -> str:
        found = self.host.state.rigs.get(rig)
        return found.base_branch if found else "main"

    # ---- steps several jobs take ---------------------------------------------------------------

    def session(self, session_id: str) -> Session | None:
        return self.host.state.sessions.get(session_id)

    async def append(self, *events: NewEvent) -> int:
        return await self.host.append_owed(list(events))

    async def end(self, session: Session, reason: str, detail: str = "") -> None:
        current = self.session(session.id) or session
        await self.append(
            NewEvent(
                payload=SessionEnded(session_id=session.id, reason=reason, detail=detail), expected_seq=current.version
            )
        )

    async def raise_escalation(self, session: Session, message: str) -> None:
        source = f"witness/{session.rig}"
        await self.host.store(
            EscalationRaise(
                severity="high",
                message=message,
                source=source,
                bead=session.bead,
                # Whatever stopped the session, nothing is left to do once its bead is closed (merged by a later
                # session, or given up): the mayor closes it then.
                resolved_when=[f"bead:{session.bead}"],
                cmd_id=f"esc-{session.id}",
            )
        )

    def pane_tail(self, session: Session) -> str:
        """The last lines the session's pane shows (a dead pane stays, so a zombie's last words are there): put in
        the warrant, so the log tells a later session what its predecessor was doing. Empty when there is none."""
        try:
            return self.tmux.tail_if_labelled(session.tmux_name, session.id)
        except TmuxError as exc:
            log.warning("pane_tail_failed", session=session.id, error=str(exc))
            return ""

    def transcript_tail(self, session: Session) -> str:
        """What the agent said and did last, from its runtime's transcript (I/O: call it in a thread); "" when there
        is none."""
        runtime = runtime_for(agent_of(session, self.host.state.rigs.get(session.rig)))
        return transcript_read.last_entries(self.session_dir(session), runtime)

    def stop_if_ours(self, session: Session) -> bool:
        """Stop the session's agent (its process tree) and kill its tmux session, each only if it is still the one
        recorded: the pane's pid and start time, the tmux session's label. Whether the tmux session was killed."""
        pane = self.tmux.snapshot().get(session.tmux_name)
        if pane is None or pane.label != session.id:
            return False  # gone, or the name now belongs to another session: nothing of ours to kill
        if session.pane_pid and session.pid_started:
            ref = processes.ProcessRef(pid=session.pane_pid, started=session.pid_started)
            # Only a process with the recorded pid AND start time is signalled: a reused pid never is.
            # The pane's process is the session's reaper: SIGTERM has it end every process of the session within
            # GT_KILL_GRACE; only what is left after that (a pane without a reaper) is killed from here.
            if pane.pane_pid == session.pane_pid and processes.is_alive(ref):
                processes.stop_tree(ref, timeout=self.settings.kill_grace_s + REAPER_SLACK_S)
        return self.tmux.kill_if_labelled(session.tmux_name, session.id)

    def ended_in(self, worktree: str, *, but: str = "") -> list[Session]:
        """The ended sessions (but the session ``but``) that worked in ``worktree``."""
        return [
            s
            for s in self.host.state.sessions.values()
            if s.worktree == worktree and s.id != but and s.status == "ended"
        ]

    def leftovers_of(self, worktree: str, earlier: list[Session]) -> list[leftovers.Leftover]:
        """The processes of the sessions ``earlier`` (ended, in ``worktree``) still running (``leftovers.find``)."""
        roots = [
            processes.ProcessRef(pid=s.pane_pid, started=s.pid_started) for s in earlier if s.pane_pid and s.pid_started
        ]
        paths = [worktree, *(str(self.session_dir(s)) for s in earlier)]
        uid = self.agent_user.uid if self.agent_user is not None else os.getuid()
        return leftovers.find(roots=roots, sessions={s.id for s in earlier}, paths=paths, agent_uid=uid)

    def reap(self, session: Session) -> None:
        self.password_file(session).unlink(missing_ok=True)  # the session has ended: nobody needs it any more
        self.launch_fifo(session).unlink(missing_ok=True)  # its reaper never took its launch
        self.stop_if_ours(session)
