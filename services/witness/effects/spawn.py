"""Starting a session: its request, the earlier sessions' leftovers gone, its worktree (a git worktree of the rig's
clone), its bead's hook lease, its tmux pane running the agent, its start recorded; giving up on a session that
does not start; re-slinging a stale hook; releasing the hook an ended session held."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
from pathlib import Path
from typing import Any

import structlog

from services.witness import plan as planning
from services.witness.effects import agent_user, clone_fetch, runtime_setup, start_answer, workspace_records
from services.witness.effects.agent_env import AgentLaunch
from services.witness.effects.toolkit import StartBlockedError, Toolkit, WorktreeUnusableError
from services.witness.plan.actions import ClaimBead, GiveUp, ReleaseHook, Resling, Spawn, Start
from services.witness.plan.sessions import claim_owed
from services.witness.state import Rig, Session, agent_of
from shared.core.faults import crash_point, hold_point
from shared.core.ids import hook_lease_name
from shared.host import git, processes, reaper, safe_files
from shared.host.tmux import PaneInfo, TmuxError
from shared.model import leases as lease_state
from shared.model import runtimes
from shared.model.commands import BeadClaim, BeadSling, Fence
from shared.model.decision import NewEvent
from shared.model.events import SessionEscalated, SessionRequested, SessionStarted

log = structlog.get_logger(__name__)

LAUNCH_TIMEOUT_S = 60.0
"""How long a start waits for its pane's reaper to read its launch (a Python start, on a machine busy with other
agents' starts) before it counts as a failed start, tried again."""
LEFTOVER_DEADLINE_S = 30.0
"""How long a new session waits for an earlier session's processes in its worktree to be gone before the witness
escalates (it keeps trying: the worktree is never handed over while one runs)."""


class Spawner:
    def __init__(self, kit: Toolkit, launch: AgentLaunch) -> None:
        self.kit = kit
        self.launch = launch
        self.start_failures: dict[str, int] = {}
        """Session -> its starts that failed in a row (``GiveUp`` after ``max_start_failures``)."""
        self._claims_stored: set[str] = set()
        """Sessions whose bead's claim this witness stored, not yet settled (the plan asks until the mayor has)."""

    async def spawn(self, action: Spawn) -> None:
        state = self.kit.host.state
        bead = state.beads.get(action.bead)
        rig = state.rigs.get(action.rig)
        if bead is None or rig is None or len(bead.sessions) + 1 != action.attempt:
            return
        if not planning.needs_session(state, bead, rig, self.kit.host.acting_since)[0]:
            return
        if action.resling:
            # The hook moves to the new session (the mayor records it); the command is durable in GT_CMD
            # and its id makes a resend after a crash harmless.
            await self.kit.host.store(
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
            agent=action.agent,
        )
        if not await self.kit.append(NewEvent(payload=requested, expected_seq=0)):
            return  # someone else requested this attempt first
        log.info("session_requested", session=action.session, bead=action.bead, polecat=action.polecat)
        crash_point("witness.after_requested")
        await self.start(Start(session=action.session))

    async def start(self, action: Start) -> None:
        session = self.kit.session(action.session)
        if session is None or session.status != "requested":
            return
        rig = self.kit.host.state.rigs.get(session.rig)
        if rig is None:
            return
        runtime = runtimes.runtime_for(agent_of(session, rig))
        try:
            runtime_setup.check(runtime, os.environ)
        except runtime_setup.RuntimeUnavailableError as exc:
            # Retrying changes nothing: an operator must install or configure the agent. Escalated, not respawned.
            await self._agent_unavailable(session, rig, str(exc))
            return
        # Its agent's first model request waits for its start hook: the hook's answer is read while the worktree
        # is prepared, and written before the pane starts.
        answering = (
            asyncio.create_task(start_answer.text_for(self.kit, session, runtime)) if runtime.confirms_start else None
        )
        try:
            await self._start(session, rig, answering)
        finally:
            if answering is not None:
                answering.cancel()

    async def _start(self, session: Session, rig: Rig, answering: asyncio.Task[str | None] | None) -> None:
        wanted = time.monotonic()
        # The pane is looked up and opened at once, its reaper waiting for its command (``reaper --launch``), while
        # the worktree is made ready: its locks are taken, what the clone has is looked up, the earlier sessions'
        # leftovers are looked for (once the look says whether the pane is adopted), the hook lease is taken (its
        # event's round trip). The agent starts the moment the worktree and its files are ready.
        looking_pane = asyncio.create_task(asyncio.to_thread(self._pane_before, session))
        opening = asyncio.create_task(self._open_when_looked(session, looking_pane))
        looking = asyncio.create_task(
            asyncio.to_thread(_refs_of, self.kit.bare_repo(rig.name), session.branch, rig.base_branch)
        )
        holding = asyncio.create_task(self._hold_hook(session, rig))
        launched = False
        try:
            async with self.kit.worktree_locks.hold(session.worktree), workspace_records.held(self.kit, session):
                _existing, adopting = await looking_pane
                if await self._end_leftovers(session, adopting):
                    # Processes of an earlier session outlived it: what they wrote since the workspace was settled
                    # is nowhere in its index, so the start takes the whole way.
                    await asyncio.to_thread(workspace_records.forget_settled, self.kit, session)
                await self._prepare_worktree(rig, session, await looking, wanted)
            session = await holding
            answer = await answering if answering is not None else None
            pane, adopted = await opening
            if not adopted:
                crash_point("witness.before_launch")
                await asyncio.to_thread(self._launch, session, rig, answer)
            launched = True
        except WorktreeUnusableError as exc:
            # Never touched (it may hold someone's work): the bead is escalated instead.
            await self._unusable_worktree(session, str(exc))
            return
        except (git.GitError, TmuxError):
            self.start_failures[session.id] = self.start_failures.get(session.id, 0) + 1
            raise
        except safe_files.UnsafeFileError as exc:
            # A link or a special file the workspace's agent left where the witness writes (``safe_files``), or a
            # runtime dir it made a link: never written through; the bead is escalated, the workspace kept.
            await self._unusable_worktree(session, f"the session's files cannot be prepared safely: {exc}")
            return
        finally:
            for task in (looking_pane, looking, holding):
                _settle_task(task)  # a start that failed before it needed them (a lease taken is released later)
            if not launched:
                await self._close_waiting_pane(session, opening)
        if not adopted:
            crash_point("witness.after_tmux_start")
        ref = processes.ref_of(pane.pane_pid)
        started = SessionStarted(
            session_id=session.id,
            pane_pid=pane.pane_pid,
            pid_started=ref.started if ref is not None else 0.0,
            adopted=adopted,
        )
        await hold_point("witness.before_session_started")
        current = self.kit.session(session.id) or session
        if current.status != "requested" or current.done_intent_at is not None:
            # Its agent was faster than this record (the witness busy, or back from a crash): it handed in its work
            # or its session ended already. A start recorded now would come after that in the session's life.
            log.info("session_start_overtaken", session=session.id, status=current.status)
            self.start_failures.pop(session.id, None)
            return
        await self.kit.append(NewEvent(payload=started, expected_seq=current.version))
        self.start_failures.pop(session.id, None)
        log.info("session_started", session=session.id, pane_pid=pane.pane_pid, adopted=adopted)

    async def _end_leftovers(self, session: Session, adopting: bool) -> bool:
        """Before a worktree is handed to ``session``: every process of the earlier sessions that worked in it is
        gone, verified (``effects/leftovers.py``); the ones found are stopped first (then True). Until then the start
        is blocked (tried again), and escalated once it has waited ``LEFTOVER_DEADLINE_S``. ``adopting``: its own
        agent runs already (started before a crash): nothing to look for."""
        earlier = self.kit.ended_in(session.worktree, but=session.id)
        if not earlier or adopting:
            return False
        deadline = time.monotonic() + LEFTOVER_DEADLINE_S
        stopped = False
        while True:
            found = await asyncio.to_thread(self.kit.leftovers_of, session.worktree, earlier)
            if not found:
                return stopped
            shown = ", ".join(f"{f.ref.pid} ({f.name}: {f.why})" for f in found[:10])
            log.warning("leftover_processes_stopped", session=session.id, worktree=session.worktree, processes=shown)
            # Looked for again after: one may have started another meanwhile.
            await asyncio.to_thread(processes.stop_all, [f.ref for f in found], timeout=self.kit.settings.kill_grace_s)
            stopped = True
            if time.monotonic() >= deadline:
                message = (
                    f"processes of an earlier session in worktree {session.worktree} do not end: {shown}. Session "
                    f"{session.id} of bead {session.bead} waits until they are gone; end them by hand."
                )
                await self.kit.raise_escalation(session, message)
                raise StartBlockedError(message)

    async def _hold_hook(self, session: Session, rig: Rig) -> Session:
        """Take the bead's hook lease for this session (the next fencing token), before its agent starts: from
        then on a session that had the hook earlier is fenced out. Idempotent: a restart finds it taken."""
        name = hook_lease_name(session.bead)
        hook = self.kit.host.state.hooks.get(name)
        if hook is not None and hook.held_by(session.id):
            return self.kit.session(session.id) or session
        ttl = self.kit.settings.hook_lease_ttl_s or rig.stall_after_s
        acquired, token = lease_state.acquisition(hook, name, session.id, ttl, self.kit.host.clock())
        if not await self.kit.append(acquired):
            raise StartBlockedError(f"the hook lease {name} moved while session {session.id} took it; trying again")
        log.info("hook_lease_acquired", session=session.id, lease=name, token=token)
        return self.kit.session(session.id) or session

    async def claim(self, action: ClaimBead) -> None:
        """Claim a started session's bead for its polecat (``ClaimBead``), once per session and witness: stored in
        GT_CMD under the session's own command id (another witness's, or this one's after a restart, is the same
        command, carried out once), settled by the mayor after every command on the bead stored before it."""
        state = self.kit.host.state
        # Claims the mayor has settled (or that are no longer owed) are forgotten: the set holds those in flight.
        self._claims_stored = {s for s in self._claims_stored if (o := state.sessions.get(s)) and claim_owed(state, o)}
        session = self.kit.session(action.session)
        if session is None or session.id in self._claims_stored or not claim_owed(state, session):
            return  # claimed meanwhile, or no longer this session's to claim
        hook = state.hooks[hook_lease_name(session.bead)]
        await self.kit.host.store(
            BeadClaim(
                id=session.bead,
                assignee=f"{session.rig}/{session.polecat}",
                fence=Fence(lease=hook.name, token=hook.token),
                cmd_id=f"claim-{session.id}",
            )
        )
        self._claims_stored.add(session.id)
        log.info("bead_claimed_for_polecat", session=session.id, bead=session.bead, polecat=session.polecat)

    async def resling(self, action: Resling) -> None:
        bead = self.kit.host.state.beads.get(action.bead)
        if bead is None or not bead.resling_owed:
            return
        # Durable in GT_CMD; its id makes a resend after a crash harmless. The sling clears ``resling_owed``.
        await self.kit.host.store(
            BeadSling(id=action.bead, rig=action.rig, force=True, cmd_id=f"stale-resling-{action.after}")
        )
        log.warning("stale_hook_reslung", bead=action.bead, after=action.after)

    async def release_hook(self, action: ReleaseHook) -> None:
        hook = self.kit.host.state.hooks.get(hook_lease_name(action.bead))
        if hook is None or not hook.held_by(action.session):
            return
        if await self.kit.append(lease_state.release(hook)):
            log.info("hook_lease_released", session=action.session, lease=hook.name, token=hook.token)

    async def _prepare_worktree(self, rig: Rig, session: Session, refs: set[str] | None, wanted: float) -> None:
        """``refs``: what the rig's clone had of the session's refs (``_refs_of``) at ``wanted`` (monotonic)."""
        bare, path = self.kit.bare_repo(rig.name), Path(session.worktree)
        # A start tried again after a crash (its pane started, ``session.started`` never recorded) finds the workspace
        # it prepared, perhaps with its agent's work in it: never recycled again.
        again = await asyncio.to_thread(workspace_records.prepared_for, self.kit, session)
        recycle = await asyncio.to_thread(self._recycle, session) if self._released(session) and not again else None
        branch, _ = git.worktree_refs(session.branch, rig.base_branch)
        # The clone's worktree registry is changed by one git process at a time (see git.ensure_worktree); the
        # lookups before and everything after (tmux, the agent, the events) run for many sessions at once.
        async with self.kit.repo_locks.hold(rig.name):
            fetches, merged = self.kit.clone_fetches, self.kit.host.state.base_merged.get(rig.name, 0)
            began = time.monotonic()
            if refs is None:  # no clone when looked (made now, or by a start that had the lock first): looked up
                if await asyncio.to_thread(git.ensure_bare_clone, rig.repo, bare):
                    fetches.record(rig.name, clone_fetch.Fetched(began=began, merged=merged))
            elif branch not in refs and not fetches.fresh(rig.name, merged, wanted):
                # A new branch starts from the base with every merge the queue made (``clone_fetch``); usually the
                # last release fetched already.
                await asyncio.to_thread(fetches.fetch, rig.name, bare, merged)
                refs = None  # looked up again: the fetch may have brought the base
            if recycle is not None and recycle.owner is not None:
                # Its checkout runs as the agent's user, reading the clone's objects: those just fetched too.
                await asyncio.to_thread(agent_user.open_for_reading, bare / "objects")
            try:
                # A repository of the polecat's own (nothing shared with the clone but its objects, read-only);
                # ``BUILD_OUTPUT``: the tests an agent runs leave bytecode and caches that no project's .gitignore
                # may list, and `gt done` refuses a workspace git shows changed.
                made = await asyncio.to_thread(
                    git.ensure_worktree,
                    bare,
                    path,
                    session.branch,
                    rig.base_branch,
                    refs=refs,
                    origin=rig.repo,
                    excludes=git.BUILD_OUTPUT,
                    published=await asyncio.to_thread(self._last_published, session),
                    recycle=recycle,
                )
                if made:
                    await asyncio.to_thread(workspace_records.keep_trusted_index, self.kit, session)
                    await asyncio.to_thread(workspace_records.keep_prepared, self.kit, session)
            except git.GitError as exc:
                if await asyncio.to_thread(path.exists):
                    raise WorktreeUnusableError(str(exc)) from exc
                raise

    def _recycle(self, session: Session) -> git.Recycle:
        """How the released worktree is taken (``workspace_records``): from where it was settled when released, if it
        was and agents are the witness's own user."""
        settled = workspace_records.take_settled(self.kit, session)
        recycle = workspace_records.recycle_of(self.kit, session)
        if settled is not None and recycle.owner is None and workspace_records.may_settle(self.kit):
            return recycle._replace(settled=settled)
        return recycle

    def _released(self, session: Session) -> bool:
        """The session's worktree was given up clean by the last session that had it (``git.release_worktree``):
        it is recycled for this one, not made again."""
        earlier = [
            s for s in self.kit.host.state.sessions.values() if s.worktree == session.worktree and s.id != session.id
        ]
        last = earlier[-1] if earlier else None  # in the order requested
        return last is not None and last.status == "ended" and last.cleaned and last.worktree_removed

    def _pane_before(self, session: Session) -> tuple[PaneInfo | None, bool]:
        """What the session's tmux name holds before its start, and whether it is adopted: the session's own pane,
        alive, its agent launched before a crash (its reaper read its launch). One whose reaper still waits for its
        launch is not: it is closed and opened again."""
        pane = self.kit.tmux.pane_of(session.tmux_name)
        launched = (
            pane is not None
            and self.kit.tmux.ours(pane)
            and pane.label == session.id
            and not pane.dead
            and processes.ref_of(pane.pane_pid) is not None
            and not os.path.lexists(self.kit.launch_fifo(session))
        )
        return pane, launched

    async def _open_when_looked(
        self, session: Session, looking: asyncio.Task[tuple[PaneInfo | None, bool]]
    ) -> tuple[PaneInfo, bool]:
        existing, adopting = await looking
        return await asyncio.to_thread(self._open_pane, session, existing, adopting)

    def _open_pane(self, session: Session, existing: PaneInfo | None, adopting: bool) -> tuple[PaneInfo, bool]:
        """The session's pane (``existing``, what its tmux name held when looked), opened with its reaper waiting
        for its launch, or adopted (True) when ``adopting``."""
        if existing is not None and not self.kit.tmux.ours(existing):
            # Another town's session on our tmux socket, of the same name: never ours to adopt or kill.
            socket = self.kit.tmux.socket_name
            log.warning("tmux_name_taken_by_another_town", tmux=session.tmux_name, socket=socket, session=session.id)
            raise StartBlockedError(
                f"tmux session {session.tmux_name} on socket {socket} belongs to another town; give each town its "
                "own GT_TMUX_SOCKET (docs/configuration.md)"
            )
        if existing is not None:
            if adopting:
                return existing, True  # started before a crash, never recorded: adopt it
            self._clear_tmux_name(session, existing)
        fifo = self.kit.launch_fifo(session)
        fifo.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        reaper.make_launch(str(fifo))
        # The pane's first process is the session's reaper (shared/host/reaper.py), as the witness's user: whatever
        # the agent starts, even detached, ends with the session. It starts in "/" (the worktree may not be there
        # yet), and the agent's own shell enters the workspace: no process of the witness's user ever runs with the
        # agent's directory as its working directory (relative paths the agent planted).
        supervisor = reaper.argv(self.kit.settings.kill_grace_s, launch=str(fifo))
        try:
            pane = self.kit.tmux.start(
                session.tmux_name, None, cwd="/", env=None, label=session.id, supervisor=supervisor
            )
        except BaseException:  # re-raised: only the FIFO nobody will read is removed
            fifo.unlink(missing_ok=True)
            raise
        return pane, False

    def _launch(self, session: Session, rig: Rig, answer: str | None) -> None:
        """The session's agent started in its waiting pane: its runtime's files written, ``answer`` (its start
        hook's, ``start_answer``) too, its command and whole environment given to the reaper through the launch
        FIFO, never on a command line (``ps``) of the reaper or of the tmux server.

        Raises:
            TmuxError: the pane's reaper did not take its launch (it ended, or never started).
        """
        command, env = self.launch.command(session, rig)
        run_as: tuple[str, ...] = ()
        if self.kit.agent_user is not None:
            self._hand_over(session, env)
            run_as = self.kit.agent_user.argv_prefix()
        if answer is not None:
            start_answer.write(self.kit, session, answer)
        fifo = self.kit.launch_fifo(session)
        argv = [*run_as, "sh", "-c", f"cd -- {shlex.quote(session.worktree)} && {command}"]
        try:
            reaper.give_launch(str(fifo), argv, env, timeout=LAUNCH_TIMEOUT_S)
        except OSError as exc:  # TimeoutError too
            raise TmuxError("launch", f"the pane of session {session.id} did not take its launch: {exc}") from exc

    async def _close_waiting_pane(self, session: Session, opening: asyncio.Task[tuple[PaneInfo, bool]]) -> None:
        """A start that failed before its agent was launched: the pane it opened for it is closed (its reaper, still
        waiting, ends on the SIGHUP), so no pane without an agent stays; a retry opens another."""
        try:
            _pane, adopted = await opening
        except Exception:  # noqa: BLE001 - never opened: the start's own failure says why
            return
        if not adopted:
            with contextlib.suppress(TmuxError):
                await asyncio.to_thread(self.kit.tmux.kill_if_labelled, session.tmux_name, session.id)
            self.kit.launch_fifo(session).unlink(missing_ok=True)

    def _hand_over(self, session: Session, env: dict[str, str]) -> None:
        """What the session's agent, as its own OS user, needs of the town's files (``effects/agent_user.py``)."""
        user = self.kit.agent_user
        assert user is not None
        worktree, home = Path(session.worktree), Path(env["HOME"])
        published, password = self.kit.published_dir(session), env.get("NATS_PASSWORD_FILE")
        rig_dir, bare = self.kit.rig_dir(session.rig), self.kit.bare_repo(session.rig)
        session_dir = self.kit.session_dir(session)
        rig = self.kit.host.state.rigs.get(session.rig)
        local = git.local_repository(rig.repo) if rig is not None else None
        session_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if local is not None and home == session_dir / "home":
            agent_user.trust_repository(session_dir, local, user)
        agent_user.hand_over_session(
            user, worktree, [session_dir, home, published], [Path(password)] if password else []
        )
        agent_user.open_for_traversal(
            [
                self.kit.host.config.gt_home,
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

    def _clear_tmux_name(self, session: Session, existing: PaneInfo) -> None:
        owner = self.kit.session(existing.label) if existing.label else None
        ours_and_done = existing.label == session.id or (owner is not None and owner.status == "ended")
        old_enough = time.time() - existing.created >= self.kit.settings.min_orphan_age_s
        if not ours_and_done and not (owner is None and old_enough):
            raise StartBlockedError(
                f"tmux session {session.tmux_name} is in use by {existing.label or 'something unknown'}; waiting"
            )
        # Re-verify right before killing: the same session (label and pane process) is still there.
        again = self.kit.tmux.pane_of(session.tmux_name)
        if again is not None and again.label == existing.label and again.pane_pid == existing.pane_pid:
            self.kit.tmux.kill(session.tmux_name)
            log.info("stale_tmux_session_killed", tmux=session.tmux_name, label=existing.label)

    async def _agent_unavailable(self, session: Session, rig: Rig, detail: str) -> None:
        message = (
            f"rig {rig.name}: session {session.id} (bead {session.bead}, polecat {session.polecat}) cannot start "
            f"its agent {agent_of(session, rig)!r}: {detail}. The bead waits on its hook: fix it, then re-sling it "
            f"with `gt sling {session.bead} {rig.name} --force`."
        )
        log.warning("agent_unavailable", session=session.id, rig=rig.name, detail=detail)
        await self.kit.raise_escalation(session, message)
        # Escalated before it ends: a plan made in between must not take the ended session for a death to respawn.
        escalated = SessionEscalated(session_id=session.id, reason="agent_unavailable")
        await self.kit.append(NewEvent(payload=escalated, expected_seq=session.version))
        await self.kit.end(session, "failed_to_start", message[:2000])

    async def _unusable_worktree(self, session: Session, detail: str) -> None:
        message = (
            f"the worktree {session.worktree} of bead {session.bead} cannot be used for a new session ({detail}); "
            "it was left as it is. Recover its work by hand, then re-sling the bead."
        )
        await self.kit.raise_escalation(session, message)
        await self.kit.end(session, "failed_to_start", detail[:2000])
        ended = self.kit.session(session.id) or session
        escalated = SessionEscalated(session_id=session.id, reason="worktree_unusable")
        await self.kit.append(NewEvent(payload=escalated, expected_seq=ended.version))

    async def give_up(self, action: GiveUp) -> None:
        session = self.kit.session(action.session)
        if session is not None and session.status == "requested":
            await self.kit.end(session, "failed_to_start", action.detail)
            self.start_failures.pop(session.id, None)

    def _last_published(self, session: Session) -> Path | None:
        """The newest bundle an earlier session of ``session``'s bead published (its branch as `gt done` left it):
        where a workspace made again starts."""
        found: list[tuple[float, Path]] = []
        for other in self.kit.host.state.sessions.values():
            if other.bead != session.bead or other.id == session.id:
                continue
            folder = self.kit.published_dir(other)
            for bundle in folder.glob("*.bundle") if folder.is_dir() else ():
                with contextlib.suppress(OSError):
                    found.append((bundle.stat().st_mtime, bundle))
        return max(found)[1] if found else None


def _settle_task(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` if it still runs, else take its outcome (a failure it had was the start's, or no longer
    matters): never left to be reported as never retrieved."""
    if not task.done():
        task.cancel()
    elif not task.cancelled():
        task.exception()


def _refs_of(bare: Path, branch: str, base: str) -> set[str] | None:
    """Which of the refs a session's worktree is made from exist in the rig's clone; None: no clone yet."""
    if not (bare / "HEAD").is_file():
        return None
    return git.existing_refs(bare, *git.worktree_refs(branch, base))
