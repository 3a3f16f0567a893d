"""Carries out the witness's actions with tmux, git and processes; records each step as an event.

Every step that touches the world is preceded or followed by an event so that a crash between any two
leaves a state the planner recognises (docs/architecture.md, "Failure windows"): ``session.requested`` before tmux is
asked, ``session.started`` after the pane's process is there, ``session.warranted`` before a kill and
``session.ended`` after it. Anything killed is re-verified right before the signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shlex
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import structlog

from services.witness import plan as planning
from services.witness.effects import agent_user, leftovers, runtime_setup
from services.witness.effects.agent_creds import agent_nats_credentials, is_credential
from services.witness.plan.actions import (
    Action,
    Clean,
    ContinueSession,
    DeliverNudge,
    Escalate,
    ExpireNudge,
    GiveUp,
    Kill,
    KillOrphan,
    MassDeath,
    NudgeMail,
    ReapPane,
    ReleaseHook,
    Resling,
    Spawn,
    Start,
    Warrant,
)
from services.witness.settings import WitnessSettings
from services.witness.state import Rig, Session, WitnessState, continue_nudge_id, mail_nudge_id
from shared import git, lease_state, processes, reaper, runtimes, safe_files, session_identity, subjects
from shared.aio import KeyedLocks
from shared.bus.auth_callout import CalloutSettings
from shared.bus.commands import StoredCommand
from shared.commands import BeadSling, Command, EscalationRaise, Fence, MergeRequestDone
from shared.commands.mail import OPERATOR_ADDRESS, polecat_of
from shared.commands.rigs import git_identity
from shared.config import TownConfig
from shared.decision import NewEvent
from shared.errors import GastownError
from shared.events import (
    NudgeDelivered,
    NudgeExpired,
    NudgeQueued,
    RigMassDeath,
    RigParked,
    SessionCleaned,
    SessionEnded,
    SessionEscalated,
    SessionRequested,
    SessionStarted,
    SessionWarranted,
)
from shared.faults import crash_point
from shared.formulas import rework
from shared.ids import hook_lease_name, merge_request_id
from shared.rig_state import home_name
from shared.terminal import escape_line
from shared.tmux import PaneInfo, Tmux, TmuxError, typeable

log = structlog.get_logger(__name__)

AGENT_ENV_PASSTHROUGH = (
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "GT_LOG_LEVEL",
    "GT_TOWN_PATIENCE",
)
"""What an agent gets of the witness's environment besides its own settings (plus ``GT_AGENT_ENV``); NATS
credentials are chosen by ``agent_nats_credentials``."""
FETCH_REUSE_S = 2.0
"""A new branch starts from origin's base as the rig's clone fetched it at most this long before its session was
asked for: 200 beads slung at once cost a few fetches, not 200 in a row (the merge queue rebases anyway)."""
AGENT_TERM = "screen-256color"
"""The pane is a tmux terminal, whatever terminal the witness was started from."""
MAIL_SUBJECT_SHOWN = 120
"""Characters of a message's subject typed into the pane when announcing it."""
MAIL_NUDGE_TTL_S = 1800.0
"""How long a mail announcement waits for the polecat's session (its `gt prime` lists the mail anyway)."""
CONTINUE_NUDGE_TTL_S = 600.0
"""How long the nudge that sends a restarted session on waits to be delivered (it is for that session only)."""
BLOCKED_SCREEN_CHARS = 1500
"""How much of a blocked pane's text an escalation carries."""
REAPER_SLACK_S = 3.0
"""A killed pane's reaper ends its session's processes within ``GT_KILL_GRACE`` (SIGTERM, then SIGKILL): the witness
waits this much longer before it kills what is left itself (the reaper among them)."""
LEFTOVER_DEADLINE_S = 30.0
"""How long a new session waits for an earlier session's processes in its worktree to be gone before the witness
escalates (it keeps trying: the worktree is never handed over while one runs)."""


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


class Executor:
    def __init__(self, host: Host, tmux: Tmux, settings: WitnessSettings, policy: planning.Policy) -> None:
        self.host = host
        self.tmux = tmux
        self.settings = settings
        self.policy = policy
        self._agent_credentials = (
            settings.agent_credentials if settings.agent_credentials is not None else agent_nats_credentials(os.environ)
        )
        """What sessions get without an auth callout: read once, before the witness forgot its secrets."""
        self.agent_user = agent_user.resolve(settings.agent_user)
        agent_user.check_reachable(self.agent_user, host.config.gt_home)
        """The OS user agents run as (``GT_AGENT_USER``), checked at start-up; None: the witness's own."""
        self.start_failures: dict[str, int] = {}
        # A worktree's lock: one start, clean-up or done flow of a worktree at a time. A rig's: one git process
        # at a time that changes the rig's clone as a whole (clone, fetch, adding or removing a worktree, a push's
        # remote-tracking ref). Everything else of a session's start runs for many at once. Order: the worktree's
        # lock, then the rig's.
        self._worktree_locks = KeyedLocks()
        self._repo_locks = KeyedLocks()
        self._pane_locks = KeyedLocks()
        """A pane's: one nudge typed into it at a time, its text and its Enter as one unit (two typed at once would
        arrive as one line)."""
        self._fetched_at: dict[str, float] = {}
        """Rig -> when (monotonic) its clone's newest successful fetch began."""
        """Clones (rig, inode) whose info/exclude this process has written."""
        self._handlers: Mapping[type[Action], Callable[[Any], Awaitable[None]]] = {
            Spawn: self.spawn,
            Start: self.start,
            GiveUp: self.give_up,
            Warrant: self.warrant,
            Kill: self.kill,
            Escalate: self.escalate,
            Clean: self.clean,
            ReapPane: self.reap_pane,
            ReleaseHook: self.release_hook,
            Resling: self.resling,
            KillOrphan: self.kill_orphan,
            MassDeath: self.mass_death,
            DeliverNudge: self.deliver_nudge,
            ContinueSession: self.continue_session,
            NudgeMail: self.nudge_mail,
            ExpireNudge: self.expire_nudge,
        }

    async def run(self, action: Action) -> None:
        with structlog.contextvars.bound_contextvars(action=type(action).__name__, key=action.key):
            await self._handlers[type(action)](action)

    # ---- paths and helpers ---------------------------------------------------------------------

    def rig_dir(self, rig: str) -> Path:
        """The rig's directory: its current incarnation's (``rig_state.home_name``)."""
        record = self.host.state.rigs.get(rig)
        return Path(self.policy.rigs_root) / (home_name(record) if record is not None else rig)

    def bare_repo(self, rig: str) -> Path:
        return self.rig_dir(rig) / "repo.git"

    def _last_published(self, session: Session) -> Path | None:
        """The newest bundle an earlier session of ``session``'s bead published (its branch as `gt done` left it):
        where a workspace made again starts."""
        found: list[tuple[float, Path]] = []
        for other in self.host.state.sessions.values():
            if other.bead != session.bead or other.id == session.id:
                continue
            folder = self.published_dir(other)
            for bundle in folder.glob("*.bundle") if folder.is_dir() else ():
                with contextlib.suppress(OSError):
                    found.append((bundle.stat().st_mtime, bundle))
        return max(found)[1] if found else None

    def published_dir(self, session: Session) -> Path:
        """Where the session's `gt done` publishes its branch (``git.publish``): kept until its bead is closed."""
        return self.rig_dir(session.rig) / "published" / session.id

    def password_file(self, session: Session) -> Path:
        """Where the session's NATS password is (``NATS_PASSWORD_FILE``): not on the tmux command line that
        starts the agent, where ``ps`` and every process on the tmux socket could read it."""
        return self.rig_dir(session.rig) / "secrets" / f"{session.id}.nats-password"

    def session_dir(self, session: Session) -> Path:
        """The session's runtime dir: an agent runtime's config home and hook marks (``GT_SESSION_DIR``)."""
        return self.rig_dir(session.rig) / "sessions" / session.id

    def _write_password(self, session: Session, password: str) -> Path:
        path = self.password_file(session)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.parent.chmod(0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            os.fchmod(fd, 0o600)  # made before, under another umask
            out.write(password + "\n")
        return path

    def _session(self, session_id: str) -> Session | None:
        return self.host.state.sessions.get(session_id)

    async def _append(self, *events: NewEvent) -> int:
        return await self.host.append_owed(list(events))

    async def _end(self, session: Session, reason: str, detail: str = "") -> None:
        current = self._session(session.id) or session
        await self._append(
            NewEvent(
                payload=SessionEnded(session_id=session.id, reason=reason, detail=detail), expected_seq=current.version
            )
        )

    # ---- spawning ------------------------------------------------------------------------------

    async def spawn(self, action: Spawn) -> None:
        state = self.host.state
        bead = state.beads.get(action.bead)
        rig = state.rigs.get(action.rig)
        if bead is None or rig is None or len(bead.sessions) + 1 != action.attempt:
            return
        if not planning.needs_session(state, bead, rig, self.host.acting_since)[0]:
            return
        if action.resling:
            # The hook moves to the new session (the mayor records it); the command is durable in GT_CMD
            # and its id makes a resend after a crash harmless.
            await self.host.store(
                BeadSling(
                    id=action.bead,
                    rig=action.rig,
                    force=True,
                    session=action.session,
                    cmd_id=f"resling-{action.session}",
                )
            )
        requested = SessionRequested(
            session_id=action.session,
            rig=action.rig,
            polecat=action.polecat,
            bead=action.bead,
            worktree=action.worktree,
            branch=action.branch,
            tmux_name=action.tmux_name,
            attempt=action.attempt,
            handoff_of=action.handoff_of,
        )
        if not await self._append(NewEvent(payload=requested, expected_seq=0)):
            return  # someone else requested this attempt first
        log.info("session_requested", session=action.session, bead=action.bead, polecat=action.polecat)
        crash_point("witness.after_requested")
        await self.start(Start(session=action.session))

    async def start(self, action: Start) -> None:
        session = self._session(action.session)
        if session is None or session.status != "requested":
            return
        rig = self.host.state.rigs.get(session.rig)
        if rig is None:
            return
        try:
            runtime_setup.check(runtimes.runtime_for(rig.agent_command), os.environ)
        except runtime_setup.RuntimeUnavailableError as exc:
            # Retrying changes nothing: an operator must install or configure the agent. Escalated, not respawned.
            await self._agent_unavailable(session, rig, str(exc))
            return
        try:
            async with self._worktree_locks.hold(session.worktree):
                await self._end_leftovers(session)
                await self._prepare_worktree(rig, session)
        except WorktreeUnusableError as exc:
            # Never touched (it may hold someone's work): the bead is escalated instead.
            await self._unusable_worktree(session, str(exc))
            return
        except git.GitError:
            self.start_failures[session.id] = self.start_failures.get(session.id, 0) + 1
            raise
        session = await self._hold_hook(session, rig)
        try:
            pane, adopted = await asyncio.to_thread(self._start_tmux, session, rig)
        except TmuxError:
            self.start_failures[session.id] = self.start_failures.get(session.id, 0) + 1
            raise
        except safe_files.UnsafeFileError as exc:
            # A link or a special file the workspace's agent left where the witness writes (``safe_files``), or a
            # runtime dir it made a link: never written through; the bead is escalated, the workspace kept.
            await self._unusable_worktree(session, f"the session's files cannot be prepared safely: {exc}")
            return
        if not adopted:
            crash_point("witness.after_tmux_start")
        ref = processes.ref_of(pane.pane_pid)
        started = SessionStarted(
            session_id=session.id,
            pane_pid=pane.pane_pid,
            pid_started=ref.started if ref is not None else 0.0,
            adopted=adopted,
        )
        current = self._session(session.id) or session
        await self._append(NewEvent(payload=started, expected_seq=current.version))
        self.start_failures.pop(session.id, None)
        log.info("session_started", session=session.id, pane_pid=pane.pane_pid, adopted=adopted)

    async def _end_leftovers(self, session: Session) -> None:
        """Before a worktree is handed to ``session``: every process of the earlier sessions that worked in it is
        gone, verified (``effects/leftovers.py``); the ones found are stopped first. Until then the start is blocked
        (tried again), and escalated once it has waited ``LEFTOVER_DEADLINE_S``."""
        earlier = [
            s
            for s in self.host.state.sessions.values()
            if s.worktree == session.worktree and s.id != session.id and s.status == "ended"
        ]
        if not earlier:
            return
        pane = await asyncio.to_thread(self.tmux.pane_of, session.tmux_name)
        if pane is not None and self.tmux.ours(pane) and pane.label == session.id:
            return  # its own agent runs already (started before a crash): adopted, not a leftover
        roots = [
            processes.ProcessRef(pid=s.pane_pid, started=s.pid_started) for s in earlier if s.pane_pid and s.pid_started
        ]
        paths = [session.worktree, *(str(self.session_dir(s)) for s in earlier)]
        uid = self.agent_user.uid if self.agent_user is not None else os.getuid()
        ids = {s.id for s in earlier}
        deadline = time.monotonic() + LEFTOVER_DEADLINE_S
        while True:
            found = await asyncio.to_thread(leftovers.find, roots=roots, sessions=ids, paths=paths, agent_uid=uid)
            if not found:
                return
            shown = ", ".join(f"{f.ref.pid} ({f.name}: {f.why})" for f in found[:10])
            log.warning("leftover_processes_stopped", session=session.id, worktree=session.worktree, processes=shown)
            # Looked for again after: one may have started another meanwhile.
            await asyncio.to_thread(processes.stop_all, [f.ref for f in found], timeout=self.settings.kill_grace_s)
            if time.monotonic() >= deadline:
                message = (
                    f"processes of an earlier session in worktree {session.worktree} do not end: {shown}. Session "
                    f"{session.id} of bead {session.bead} waits until they are gone; end them by hand."
                )
                await self._raise_escalation(session, message)
                raise StartBlockedError(message)

    async def _hold_hook(self, session: Session, rig: Rig) -> Session:
        """Take the bead's hook lease for this session (the next fencing token), before its agent starts: from
        then on a session that had the hook earlier is fenced out. Idempotent: a restart finds it taken."""
        name = hook_lease_name(session.bead)
        hook = self.host.state.hooks.get(name)
        if hook is not None and hook.held_by(session.id):
            return self._session(session.id) or session
        ttl = self.settings.hook_lease_ttl_s or rig.stall_after_s
        acquired, token = lease_state.acquisition(hook, name, session.id, ttl, self.host.clock())
        if not await self._append(acquired):
            raise StartBlockedError(f"the hook lease {name} moved while session {session.id} took it; trying again")
        log.info("hook_lease_acquired", session=session.id, lease=name, token=token)
        return self._session(session.id) or session

    async def resling(self, action: Resling) -> None:
        bead = self.host.state.beads.get(action.bead)
        if bead is None or not bead.resling_owed:
            return
        # Durable in GT_CMD; its id makes a resend after a crash harmless. The sling clears ``resling_owed``.
        await self.host.store(
            BeadSling(id=action.bead, rig=action.rig, force=True, cmd_id=f"stale-resling-{action.after}")
        )
        log.warning("stale_hook_reslung", bead=action.bead, after=action.after)

    async def release_hook(self, action: ReleaseHook) -> None:
        hook = self.host.state.hooks.get(hook_lease_name(action.bead))
        if hook is None or not hook.held_by(action.session):
            return
        if await self._append(lease_state.release(hook)):
            log.info("hook_lease_released", session=action.session, lease=hook.name, token=hook.token)

    async def _prepare_worktree(self, rig: Rig, session: Session) -> None:
        bare, path = self.bare_repo(rig.name), Path(session.worktree)
        wanted = time.monotonic()
        refs = await asyncio.to_thread(_refs_of, bare, session.branch, rig.base_branch)
        branch, _ = git.worktree_refs(session.branch, rig.base_branch)
        # The clone's worktree registry is changed by one git process at a time (see git.ensure_worktree); the
        # lookups before and everything after (tmux, the agent, the events) run for many sessions at once.
        async with self._repo_locks.hold(rig.name):
            began = time.monotonic()
            if refs is None:  # no clone when looked (made now, or by a start that had the lock first): looked up
                if await asyncio.to_thread(git.ensure_bare_clone, rig.repo, bare):
                    self._fetched_at[rig.name] = began
            elif branch not in refs and self._fetched_at.get(rig.name, float("-inf")) < wanted - FETCH_REUSE_S:
                await asyncio.to_thread(git.fetch, bare)  # a new branch starts from the newest base
                self._fetched_at[rig.name] = began
                refs = None  # looked up again: the fetch may have brought the base
            try:
                # A repository of the polecat's own (nothing shared with the clone but its objects, read-only);
                # ``BUILD_OUTPUT``: the tests an agent runs leave bytecode and caches that no project's .gitignore
                # may list, and `gt done` refuses a workspace git shows changed.
                await asyncio.to_thread(
                    git.ensure_worktree,
                    bare,
                    path,
                    session.branch,
                    rig.base_branch,
                    refs=refs,
                    origin=rig.repo,
                    excludes=git.BUILD_OUTPUT,
                    published=await asyncio.to_thread(self._last_published, session),
                )
            except git.GitError as exc:
                if await asyncio.to_thread(path.exists):
                    raise WorktreeUnusableError(str(exc)) from exc
                raise

    def _start_tmux(self, session: Session, rig: Rig) -> tuple[PaneInfo, bool]:
        existing = self.tmux.pane_of(session.tmux_name)
        if existing is not None and not self.tmux.ours(existing):
            # Another town's session on our tmux socket, of the same name: never ours to adopt or kill.
            socket = self.tmux.socket_name
            log.warning("tmux_name_taken_by_another_town", tmux=session.tmux_name, socket=socket, session=session.id)
            raise StartBlockedError(
                f"tmux session {session.tmux_name} on socket {socket} belongs to another town; give each town its "
                "own GT_TMUX_SOCKET (docs/configuration.md)"
            )
        if existing is not None:
            if existing.label == session.id and not existing.dead and processes.ref_of(existing.pane_pid):
                return existing, True  # started before a crash, never recorded: adopt it
            self._clear_tmux_name(session, existing)
        command, env = self._agent_command(session, rig)
        run_as: tuple[str, ...] = ()
        cwd = session.worktree
        if self.agent_user is not None:
            self._hand_over(session, env)
            run_as = self.agent_user.argv_prefix()
            # tmux (root) starts the pane in "/", and the agent's own shell enters the workspace: no root process
            # ever runs with the agent's directory as its working directory (relative paths the agent planted).
            cwd, command = "/", f"cd -- {shlex.quote(session.worktree)} && {command}"
        # The pane's first process is the session's reaper (shared/reaper.py), as the witness's user: whatever the
        # agent starts, even detached, ends with the session.
        supervisor = reaper.argv(self.settings.kill_grace_s)
        pane = self.tmux.start(
            session.tmux_name, command, cwd=cwd, env=env, label=session.id, run_as=run_as, supervisor=supervisor
        )
        return pane, False

    def _hand_over(self, session: Session, env: dict[str, str]) -> None:
        """What the session's agent, as its own OS user, needs of the town's files (``effects/agent_user.py``)."""
        user = self.agent_user
        assert user is not None
        worktree, home = Path(session.worktree), Path(env["HOME"])
        published, password = self.published_dir(session), env.get("NATS_PASSWORD_FILE")
        rig_dir, bare = self.rig_dir(session.rig), self.bare_repo(session.rig)
        session_dir = self.session_dir(session)
        rig = self.host.state.rigs.get(session.rig)
        local = git.local_repository(rig.repo) if rig is not None else None
        session_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if local is not None and home == session_dir / "home":
            agent_user.trust_repository(session_dir, local, user)
        agent_user.hand_over_session(
            user, worktree, [session_dir, home, published], [Path(password)] if password else []
        )
        agent_user.open_for_traversal(
            [
                self.host.config.gt_home,
                rig_dir.parent,
                rig_dir,
                bare,
                worktree.parent,
                published.parent,
                session_dir.parent,
                *([Path(password).parent] if password else []),
            ]
        )
        agent_user.open_for_reading(bare / "objects")

    def _agent_command(self, session: Session, rig: Rig) -> tuple[str, dict[str, str]]:
        """The pane's command line and environment, from the rig's runtime (its files written first)."""
        runtime = runtimes.runtime_for(rig.agent_command)
        env = self.agent_env(session, rig)
        binary = ""
        if isinstance(runtime, runtimes.ClaudeRuntime):
            binary, added = runtime_setup.prepare_claude(
                runtime,
                worktree=Path(session.worktree),
                session_dir=self.session_dir(session),
                env=os.environ,
                as_root=os.geteuid() == 0 and self.agent_user is None,
                owner=(self.agent_user.uid, self.agent_user.gid) if self.agent_user is not None else None,
            )
            env.update(added)  # its own HOME and config home win over the witness's
        elif self.agent_user is not None:
            # The witness's HOME is root's: the agent gets one of its own in the session's runtime dir.
            env["HOME"] = str(self.session_dir(session) / "home")
        if self.agent_user is not None:
            env.update(USER=self.agent_user.name, LOGNAME=self.agent_user.name)
        return runtime.command(self.beacon(session), binary), env

    def _clear_tmux_name(self, session: Session, existing: PaneInfo) -> None:
        owner = self._session(existing.label) if existing.label else None
        ours_and_done = existing.label == session.id or (owner is not None and owner.status == "ended")
        old_enough = time.time() - existing.created >= self.settings.min_orphan_age_s
        if not ours_and_done and not (owner is None and old_enough):
            raise StartBlockedError(
                f"tmux session {session.tmux_name} is in use by {existing.label or 'something unknown'}; waiting"
            )
        # Re-verify right before killing: the same session (label and pane process) is still there.
        again = self.tmux.pane_of(session.tmux_name)
        if again is not None and again.label == existing.label and again.pane_pid == existing.pane_pid:
            self.tmux.kill(session.tmux_name)
            log.info("stale_tmux_session_killed", tmux=session.tmux_name, label=existing.label)

    def beacon(self, session: Session) -> str:
        state = self.host.state
        bead = state.beads.get(session.bead)
        title = bead.title if bead else ""
        progress = ""
        if bead is not None and bead.steps:
            progress = (
                f" Molecule: {len(bead.done_steps)}/{len(bead.steps)} steps done, current step "
                f"{bead.current_step or '(none: all done)'}."
            )
            if bead.current_step is not None and rework.is_rework(bead.current_step):
                progress += " The merge queue sent your work back: the rework steps say what to do."
        return (
            f"[gastown] You are polecat {session.polecat} of rig {session.rig} (session {session.id}, attempt "
            f"{session.attempt}). Your hook: bead {session.bead}: {title}.{progress} Worktree {session.worktree}, "
            f"branch {session.branch}. Run `gt prime` for everything you need; finish with `gt done`."
        )

    def agent_env(self, session: Session, rig: Rig) -> dict[str, str]:
        config = self.host.config
        bin_dir = str(Path(sys.executable).parent)
        env = {
            "GT_RIG": rig.name,
            "GT_RIG_HOME": home_name(rig),
            "GT_BEAD": session.bead,
            "GT_SESSION": session.id,
            "GT_POLECAT": session.polecat,
            "GT_WORKTREE": session.worktree,
            "GT_BRANCH": session.branch,
            "GT_BASE_BRANCH": rig.base_branch,
            "GT_ATTEMPT": str(session.attempt),
            "GT_BEACON": self.beacon(session),
            "GT_HOME": str(config.gt_home),
            "GT_EVT_STREAM": config.evt_stream,
            "GT_CMD_STREAM": config.cmd_stream,
            "GT_HEARTBEAT_BUCKET": config.heartbeat_bucket,
            "GT_LEASE_BUCKET": config.lease_bucket,
            "GT_TMUX_SOCKET": self.settings.tmux_socket,
            "NATS_URL": config.nats_url,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "TERM": AGENT_TERM,
            **polecat_git_env(rig, session.polecat),
        }
        if session.lease_token is not None:
            env["GT_LEASE"] = hook_lease_name(session.bead)
            env["GT_LEASE_TOKEN"] = str(session.lease_token)
            # Its TTL: an agent busy in a long command knows how often to renew it (gt-agent's heartbeats).
            hook = self.host.state.hooks.get(env["GT_LEASE"])
            env["GT_LEASE_TTL"] = f"{hook.ttl_s if hook is not None else rig.stall_after_s:g}"
        env.update(self._session_credentials(session))
        if (password := env.pop("NATS_PASSWORD", None)) is not None:
            env["NATS_PASSWORD_FILE"] = str(self._write_password(session, password))
        for key in (*AGENT_ENV_PASSTHROUGH, *self.settings.agent_env):
            if key in os.environ and key not in env and not is_credential(key):
                env[key] = os.environ[key]
        for key, value in os.environ.items():
            if key.startswith("GT_AGENT_") and not is_credential(key):
                env.setdefault(key, value)  # the reference agent's settings and fault injection
        return env

    def _session_credentials(self, session: Session) -> dict[str, str]:
        """The session's own NATS identity when the witness answers the auth callout: user = its session id,
        a password minted for it (good for ``GT_SESSION_CREDENTIAL_TTL``; a session that outlives it must hand
        off), its private inbox prefix. Else the agents' shared credentials (``agent_creds``)."""
        callout = self.host.callout
        if callout is None:
            return dict(self._agent_credentials)
        expires_at = int(self.host.clock().timestamp() + callout.credential_ttl_s)
        password = session_identity.mint(
            callout.session_key,
            session=session.id,
            rig=session.rig,
            polecat=session.polecat,
            bead=session.bead,
            expires_at=expires_at,
        )
        return {
            "NATS_USER": session.id,
            "NATS_PASSWORD": password,
            "NATS_INBOX_PREFIX": subjects.session_inbox_prefix(session.id),
        }

    async def _agent_unavailable(self, session: Session, rig: Rig, detail: str) -> None:
        message = (
            f"rig {rig.name}: session {session.id} (bead {session.bead}, polecat {session.polecat}) cannot start "
            f"its agent {rig.agent_command!r}: {detail}. The bead waits on its hook: fix it, then re-sling it "
            f"with `gt sling {session.bead} {rig.name} --force`."
        )
        log.warning("agent_unavailable", session=session.id, rig=rig.name, detail=detail)
        await self._raise_escalation(session, message)
        # Escalated before it ends: a plan made in between must not take the ended session for a death to respawn.
        escalated = SessionEscalated(session_id=session.id, reason="agent_unavailable")
        await self._append(NewEvent(payload=escalated, expected_seq=session.version))
        await self._end(session, "failed_to_start", message[:2000])

    async def _unusable_worktree(self, session: Session, detail: str) -> None:
        message = (
            f"the worktree {session.worktree} of bead {session.bead} cannot be used for a new session ({detail}); "
            "it was left as it is. Recover its work by hand, then re-sling the bead."
        )
        await self._raise_escalation(session, message)
        await self._end(session, "failed_to_start", detail[:2000])
        ended = self._session(session.id) or session
        escalated = SessionEscalated(session_id=session.id, reason="worktree_unusable")
        await self._append(NewEvent(payload=escalated, expected_seq=ended.version))

    async def give_up(self, action: GiveUp) -> None:
        session = self._session(action.session)
        if session is not None and session.status == "requested":
            await self._end(session, "failed_to_start", action.detail)
            self.start_failures.pop(session.id, None)

    # ---- warrants ------------------------------------------------------------------------------

    async def warrant(self, action: Warrant) -> None:
        session = self._session(action.session)
        if session is None or session.status == "ended" or session.warrant_reason is not None:
            return
        # The version the warrant is decided on, read before any await: ``session`` is the projection's live
        # record, and a session.ended applied while the pane is read must make this append conflict.
        decided_on = session.version
        if action.reason == planning.AGENT_UNAUTHORIZED:
            await self._park_refused(session, action.detail)
            session = self._session(action.session) or session
            decided_on = session.version
        tail = await asyncio.to_thread(self._pane_tail, session)
        if action.escalate:
            await self._escalate_blocked(session, action.detail, tail)
            session = self._session(action.session) or session
            decided_on = session.version
        event = SessionWarranted(session_id=session.id, reason=action.reason, detail=action.detail, pane_tail=tail)
        if not await self._append(NewEvent(payload=event, expected_seq=decided_on)):
            return
        # The pane's last lines in the log as well: why an agent died is read there first (a traceback, an error).
        log.info(
            "session_warranted", session=session.id, reason=action.reason, detail=action.detail, pane_tail=tail[-2000:]
        )
        crash_point("witness.after_warrant")
        await self.kill(Kill(session=session.id))

    async def _escalate_blocked(self, session: Session, detail: str, tail: str) -> None:
        """The agent waits at a screen before it started: tell the operator at once what the pane shows, and mark
        the session escalated before it is ended, so no fresh session is started into the same screen."""
        rig = self.host.state.rigs.get(session.rig)
        shown = tail[-BLOCKED_SCREEN_CHARS:] or "(the pane showed nothing)"
        message = (
            f"{detail}. Nobody answers it there, so session {session.id} is ended (failed_to_start) and bead "
            f"{session.bead} is not respawned into the same screen; it waits on its hook with its worktree. Its pane "
            f"showed:\n{shown}\nAnswer it for the agent's config home (docs/agents.md, Claude Code), then "
            f"`gt sling {session.bead} {rig.name if rig else session.rig} --force`."
        )
        log.warning("agent_blocked_at_screen", session=session.id, rig=session.rig, detail=detail)
        await self._raise_escalation(session, message)
        if session.escalated is None:
            escalated = SessionEscalated(session_id=session.id, reason="agent_blocked")
            await self._append(NewEvent(payload=escalated, expected_seq=session.version))

    async def _park_refused(self, session: Session, detail: str) -> None:
        """The model API refused the agent's credentials: every new session of the rig would be refused too. Park
        the rig first (so no plan made after this session ends starts another), then tell the operator."""
        rig = self.host.state.rigs.get(session.rig)
        if rig is None:
            return
        if not rig.parked:
            parked = RigParked(rig=rig.name, reason=f"agent credentials refused (session {session.id})")
            await self._append(NewEvent(payload=parked, expected_seq=rig.version))
        message = (
            f"{detail}. Session {session.id} (bead {session.bead}, polecat {session.polecat}) is ended and rig "
            f"{rig.name} is parked: no new sessions until the credentials are fixed (the witness's "
            f"ANTHROPIC_API_KEY or the other settings of docs/agents.md), then `gt rig unpark {rig.name}`; the "
            "bead waits on its hook and goes on then."
        )
        log.warning("agent_unauthorized", session=session.id, rig=rig.name, detail=detail)
        await self._raise_escalation(session, message)

    async def kill(self, action: Kill) -> None:
        session = self._session(action.session)
        if session is None or session.status == "ended" or session.warrant_reason is None:
            return
        await asyncio.to_thread(self._verify_and_kill, session)
        crash_point("witness.after_kill")
        session = self._session(action.session) or session
        reason = session.warrant_reason or "dead"
        if session.done_intent_at is not None:
            await self._finish_done(session, reason)
        elif reason == "bead_closed":
            await self._end(session, "bead_closed", "its bead was closed")
        elif reason == "unslung":
            await self._end(session, "unslung", "its bead was unslung by an operator")
        else:
            await self._end(session, reason, "killed after warrant")

    def _pane_tail(self, session: Session) -> str:
        """The last lines the session's pane shows (a dead pane stays, so a zombie's last words are there): put in
        the warrant, so the log tells a later session what its predecessor was doing. Empty when there is none."""
        try:
            return self.tmux.tail_if_labelled(session.tmux_name, session.id)
        except TmuxError as exc:
            log.warning("pane_tail_failed", session=session.id, error=str(exc))
            return ""

    def _verify_and_kill(self, session: Session) -> None:
        """Kill the session's agent and tmux session, each only if it is still the one we recorded."""
        if self._stop_if_ours(session):
            log.info("session_killed", session=session.id, tmux=session.tmux_name)

    def _stop_if_ours(self, session: Session) -> bool:
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

    async def _finish_done(self, session: Session, after: str) -> None:
        """The agent died (or hung) after its done-intent: publish the branch and submit it, as `gt done` would."""
        rig = self.host.state.rigs.get(session.rig)
        if rig is None:
            return
        try:
            async with self._worktree_locks.hold(session.worktree):
                published = await asyncio.to_thread(
                    git.publish, Path(session.worktree), session.branch, rig.base_branch, self.published_dir(session)
                )
        except git.GitError as exc:
            log.warning("done_flow_failed", session=session.id, error=str(exc))
            death = "stalled" if after == "stuck_in_done" else after
            await self._end(session, death, f"the done flow could not finish: {exc}"[:2000])
            return
        crash_point("witness.after_done_push")
        fence = None
        if session.lease_token is not None:
            # On the session's behalf, with its hook lease: the refinery takes the bead's work from its holder only.
            fence = Fence(lease=hook_lease_name(session.bead), token=session.lease_token)
        done = MergeRequestDone(
            bead=session.bead,
            rig=session.rig,
            branch=session.branch,
            head=published.head,
            bundle=str(published.bundle),
            session=session.id,
            fence=fence,
            cmd_id=merge_request_id(session.id, published.head),
        )
        await self.host.store(done)
        crash_point("witness.after_mr_submit")
        await self._end(session, "done", f"done flow finished by the witness after {after}")
        log.info("done_flow_finished_by_witness", session=session.id, head=published.head)

    # ---- escalations ---------------------------------------------------------------------------

    async def _raise_escalation(self, session: Session, message: str) -> None:
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

    async def escalate(self, action: Escalate) -> None:
        session = self._session(action.session)
        if session is None or session.escalated is not None:
            return
        await self._raise_escalation(session, action.message)
        await self._append(
            NewEvent(
                payload=SessionEscalated(session_id=session.id, reason=action.reason), expected_seq=session.version
            )
        )
        log.warning("bead_escalated", session=session.id, bead=session.bead, reason=action.reason)

    async def mass_death(self, action: MassDeath) -> None:
        rig = self.host.state.rigs.get(action.rig)
        if rig is None:
            return
        died = [s for sid in action.sessions if (s := self._session(sid)) is not None]
        beads = sorted({s.bead for s in died})
        # The newest death that left words: what an operator reads first to find the common cause.
        said = next((s for s in reversed(died) if s.pane_tail or s.end_detail), None)
        message = (
            f"mass death on rig {action.rig}: {len(action.sessions)} sessions of {len(beads)} beads died within "
            f"{action.window_s:g}s ({', '.join(action.sessions)}). Something common may be broken (agent "
            "command, credentials, disk, the machine)."
        ) + (f" {planning.last_words(said)}".rstrip() if said is not None else "")
        source = f"witness/{action.rig}"
        await self.host.store(
            EscalationRaise(
                severity="critical",
                message=message,
                source=source,
                # A session of the rig that finishes its work shows that what they shared works again.
                resolved_when=[f"rig:{action.rig}"],
                cmd_id=f"massdeath-{action.sessions[0]}",
            )
        )
        event = RigMassDeath(rig=action.rig, sessions=list(action.sessions), window_s=action.window_s)
        await self._append(NewEvent(payload=event, expected_seq=rig.version))
        log.warning("mass_death", rig=action.rig, sessions=list(action.sessions))

    # ---- cleanup -------------------------------------------------------------------------------

    def _reap(self, session: Session) -> None:
        self.password_file(session).unlink(missing_ok=True)  # the session has ended: nobody needs it any more
        self._stop_if_ours(session)

    async def reap_pane(self, action: ReapPane) -> None:
        session = self._session(action.session)
        if session is not None and session.status == "ended":
            await asyncio.to_thread(self._reap, session)

    async def clean(self, action: Clean) -> None:
        session = self._session(action.session)
        if session is None or session.status != "ended" or (session.cleaned and not action.again):
            return
        if action.again and (session.worktree_removed or session.cleanings != 1):
            return  # done meanwhile
        # Its pane's last lines, before the pane goes (a warrant recorded them already): what an agent said last.
        tail = "" if session.pane_tail or action.again else await asyncio.to_thread(self._pane_tail, session)
        await asyncio.to_thread(self._reap, session)
        removed, detail = False, action.detail
        if action.remove_worktree:
            try:
                async with self._worktree_locks.hold(session.worktree), self._repo_locks.hold(session.rig):
                    # Decided before it waited for the worktree: a session of the same polecat may have been started
                    # in it meanwhile (work the merge queue sent back), and it is that session's worktree now.
                    successor = self._worktree_user(session)
                    if successor is not None:
                        detail = f"worktree carried on by {successor.id}"
                    else:
                        detail = await asyncio.to_thread(self._remove_worktree, session)
                        removed = True
            except git.WorktreeNotEmptyError as exc:
                detail = str(exc)
                log.warning("worktree_kept", session=session.id, reason=detail)
        bead = self.host.state.beads.get(session.bead)
        if bead is not None and bead.status == "closed":
            # Its published bundles were taken by the refinery (or will never be): gone with the bead's work.
            await asyncio.to_thread(git.force_remove, self.published_dir(session))
        current = self._session(session.id) or session
        event = SessionCleaned(session_id=session.id, worktree_removed=removed, detail=detail, pane_tail=tail)
        await self._append(NewEvent(payload=event, expected_seq=current.version))

    def _worktree_user(self, session: Session) -> Session | None:
        """Another session, not ended, that works in ``session``'s worktree."""
        for other in self.host.state.sessions.values():
            if other.id != session.id and other.worktree == session.worktree and other.status != "ended":
                return other
        return None

    def _remove_worktree(self, session: Session) -> str:
        """Remove the session's worktree unless it holds unsaved work (``WorktreeNotEmptyError``); what was done."""
        worktree, bare = Path(session.worktree), self.bare_repo(session.rig)
        if not worktree.exists() and not bare.exists():
            return "no worktree was made"  # a start that failed before the rig's clone: nothing for git to do
        git.remove_worktree(bare, worktree, self._base(session.rig))
        return "worktree removed"

    def _base(self, rig: str) -> str:
        found = self.host.state.rigs.get(rig)
        return found.base_branch if found else "main"

    async def kill_orphan(self, action: KillOrphan) -> None:
        await asyncio.to_thread(self._kill_orphan, action)

    def _kill_orphan(self, action: KillOrphan) -> None:
        # Re-check right before the kill: still there, still the same session, still nobody's, still old.
        pane = self.tmux.snapshot().get(action.tmux_name)  # our town's sessions only
        if pane is None or pane.created != action.created or pane.pane_pid != action.pane_pid:
            return
        if not pane.town or not self.tmux.ours(pane):
            return  # not marked as our town's: never an orphan of ours
        if pane.label in self.host.state.sessions:
            return
        if time.time() - pane.created < self.settings.min_orphan_age_s:
            return
        self.tmux.kill(action.tmux_name)
        log.warning("orphan_tmux_session_killed", tmux=action.tmux_name, label=pane.label, pane_pid=pane.pane_pid)

    # ---- nudges --------------------------------------------------------------------------------

    async def deliver_nudge(self, action: DeliverNudge) -> None:
        nudge = self.host.state.nudges.get(action.nudge)
        session = self._session(action.session)
        if nudge is None or nudge.status != "queued" or session is None or session.status != "started":
            return
        decided_on = nudge.version  # before the await: an expiry applied meanwhile makes the append conflict
        rig = self.host.state.rigs.get(session.rig)
        typing = runtimes.runtime_for(rig.agent_command if rig is not None else "").nudge(nudge.message)
        async with self._pane_locks.hold(session.tmux_name):
            current = self.host.state.nudges.get(action.nudge)
            if current is None or current.status != "queued":
                return  # delivered or expired while it waited for the pane
            attempts = await asyncio.to_thread(self._type_into, session, typeable(typing.text), typing.submit)
        if attempts:
            event = NudgeDelivered(nudge_id=nudge.id, session=session.id, attempts=attempts)
            await self._append(NewEvent(payload=event, expected_seq=decided_on))
            log.info("nudge_delivered", nudge=nudge.id, session=session.id, attempts=attempts)

    def _type_into(self, session: Session, message: str, submit: str = "Enter") -> int:
        """Type ``message`` and press ``submit``, retrying until the text shows and the key took; attempts, 0 if
        not."""
        name = session.tmux_name
        probe = message[-60:]
        for attempt in range(1, 4):
            pane = self.tmux.snapshot().get(name)
            if pane is None or pane.label != session.id or pane.dead:
                return 0
            before = self.tmux.capture(name)
            if not _shows(before, probe) or attempt == 1:
                self.tmux.send_text(name, message)
            if not _wait_for(lambda: _shows(self.tmux.capture(name), probe), self.settings.nudge_verify_s):
                continue
            typed = self._screen(name)
            self.tmux.send_key(name, submit)
            if _wait_for(functools.partial(self._changed, name, typed), self.settings.nudge_verify_s):
                return attempt
        return 0

    def _screen(self, name: str) -> tuple[str, tuple[int, int]]:
        """What the pane shows and where its cursor is: a key that took changes one of them (a pane whose program
        does not read its input only moves the cursor; typing the text again there would show it twice)."""
        return self.tmux.capture(name), self.tmux.cursor(name)

    def _changed(self, name: str, before: tuple[str, tuple[int, int]]) -> bool:
        return self._screen(name) != before

    async def nudge_mail(self, action: NudgeMail) -> None:
        """Queue the nudge announcing a message; its id comes from the message's, so it is queued once whoever
        tries (a restart, a second witness); delivery is then the nudge's (``deliver_nudge``)."""
        notice = self.host.state.mail.get(action.message)
        if notice is None or notice.nudged:
            return
        text = mail_announcement(notice.sender, notice.subject, notice.id)
        event = NudgeQueued(
            nudge_id=mail_nudge_id(notice.id),
            rig=notice.rig,
            polecat=notice.polecat,
            message=text,
            expires_at=self.host.clock() + timedelta(seconds=MAIL_NUDGE_TTL_S),
        )
        if await self._append(NewEvent(payload=event, expected_seq=0)):
            log.info("mail_nudge_queued", message=notice.id, rig=notice.rig, polecat=notice.polecat)

    async def continue_session(self, action: ContinueSession) -> None:
        """Queue the nudge that sends a restarted session on (``ContinueSession``); its id comes from the session and
        the start, so it is queued once whoever tries; delivery is then the nudge's (``deliver_nudge``)."""
        session = self._session(action.session)
        nudge_id = continue_nudge_id(action.session, action.number)
        if session is None or session.status != "started" or nudge_id in self.host.state.nudges:
            return
        restart = runtimes.Restart(number=action.number, source=action.source, turn_ended_since=False)
        event = NudgeQueued(
            nudge_id=nudge_id,
            rig=session.rig,
            polecat=session.polecat,
            session=session.id,
            message=runtimes.continue_prompt(restart),
            expires_at=self.host.clock() + timedelta(seconds=CONTINUE_NUDGE_TTL_S),
        )
        if await self._append(NewEvent(payload=event, expected_seq=0)):
            log.info("continue_nudge_queued", session=session.id, start=action.number, source=action.source)

    async def expire_nudge(self, action: ExpireNudge) -> None:
        nudge = self.host.state.nudges.get(action.nudge)
        if nudge is not None and nudge.status == "queued":
            await self._append(NewEvent(payload=NudgeExpired(nudge_id=nudge.id), expected_seq=nudge.version))


def mail_announcement(sender: str, subject: str, message_id: str) -> str:
    """The line typed into a polecat's pane to announce a message: marked as mail, and whose, so the agent does not
    take it for its operator's words; the subject quoted, on one line, its control characters escaped and cut to
    ``MAIL_SUBJECT_SHOWN``. ``[gastown mail from polecat:demo/bob, written by an agent, not your operator]
    subject: "Use v2" (read it with: gt mail read hq-4k2p9)``."""
    who = escape_line(sender)
    if OPERATOR_ADDRESS.fullmatch(sender):
        whose = f"{who}, your operator"
    elif polecat_of(sender) is not None:
        whose = f"{who}, written by an agent, not your operator"
    else:
        whose = f"{who}, not your operator"
    shown = " ".join(escape_line(subject.replace("\t", " ")).split()).replace('"', '\\"')
    if len(shown) > MAIL_SUBJECT_SHOWN:
        shown = shown[: MAIL_SUBJECT_SHOWN - 1] + "…"
    return typeable(
        f'[gastown mail from {whose}] subject: "{shown}" (read it with: gt mail read {escape_line(message_id)})'
    )


def polecat_git_env(rig: Rig, polecat: str) -> dict[str, str]:
    """Who the polecat's commits are by, whatever its HOME's git configuration holds (often none: a container,
    a service user, a per-agent config home): the rig's identity, or ``<rig>/<polecat>`` by default."""
    name, email = git_identity(rig.git_name, rig.git_email, rig=rig.name, polecat=polecat)
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
    }


def _shows(screen: str, text: str) -> bool:
    return text in screen.replace("\n", "")


def _wait_for(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _refs_of(bare: Path, branch: str, base: str) -> set[str] | None:
    """Which of the refs a session's worktree is made from exist in the rig's clone; None: no clone yet."""
    if not (bare / "HEAD").is_file():
        return None
    return git.existing_refs(bare, *git.worktree_refs(branch, base))
