"""The witness service: rigs, polecat sessions (spawn, watch, warrant, recover), nudges.

Each reconcile observes tmux, the agents' processes and (for quiet sessions) their heartbeats, asks the
pure planner what is owed, and queues those actions; a few workers carry them out. An agent's death wakes
the witness at once through a pidfd; the patrol tick finds everything else.

A witness may serve only some rigs (``GT_WITNESS_RIGS``, see ``plan/scope.py``): it then observes, plans and acts
for those alone and settles only their commands; its scope is its identity for activity and liveness.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Literal

import msgspec
import structlog

from services.witness import decide as witness_decide
from services.witness import queries
from services.witness import settings as witness_settings
from services.witness.effects import runtime_setup
from services.witness.effects.executor import Executor, StartBlockedError
from services.witness.effects.pidwatch import ExitWatcher
from services.witness.effects.usage_watch import UsageWatch
from services.witness.plan import Observed, PaneSeen, Policy, liveness, may_linger, plan, scope
from services.witness.plan.actions import Action, Spawn
from services.witness.projection import new_projection
from services.witness.state import Session, WitnessState
from shared import git, heartbeats, leases, processes
from shared.aio import raise_if_cancelling
from shared.bus import auth_callout
from shared.bus.connection import Connection, close_quietly, connect
from shared.bus.errors import BusError
from shared.bus.kv import Bucket
from shared.commands import Command, RigAdd, SessionRecoverHook
from shared.config import TownConfig, town_mark
from shared.decision import Accepted, DecideContext, Route
from shared.errors import ActivityLostError
from shared.ids import hook_lease_name
from shared.queries import Query
from shared.queries.witness import WitnessStatus
from shared.runtimes import Restart, confirms_start, runtime_for, turn_ended_after_done
from shared.service import Service, ServiceSettings
from shared.session_identity import SessionBuckets
from shared.tmux import Tmux, TmuxError

log = structlog.get_logger(__name__)

MAX_RETRY_DELAY_S = 30.0
RECONCILE_GAP_PER_SESSION_S = 0.00025
RECONCILE_GAP_MAX_S = 0.05
SCREEN_LINES = 30
"""How much of the bottom of a pane is read for what its runtime shows (older lines are history)."""


class ScreenSeen(msgspec.Struct, frozen=True, kw_only=True):
    """What one session's pane showed at a patrol, as its runtime reads it (``Runtime``'s screen methods)."""

    refused: str | None = None
    blocked: str | None = None
    activity: str | None = None
    idle: bool = False
    restart: Restart | None = None
    read: bool = True
    """False: the pane could not be read this time (tmux busy, the pane just gone): nothing on it is judged."""


class WitnessService(Service[WitnessState]):
    name: ClassVar[str] = "witness"

    def __init__(
        self,
        config: TownConfig,
        settings: ServiceSettings | None = None,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        witness: witness_settings.WitnessSettings | None = None,
        callout: auth_callout.CalloutSettings | Literal[False] | None = None,
    ) -> None:
        """``callout``: None reads it from the environment; False: none, whatever the environment says."""
        super().__init__(config, new_projection(), settings, clock=clock)
        self.acting_since: datetime | None = clock()
        """Sessions the operator stopped from now on are left for the next witness to respawn (see plan)."""
        self.witness_settings = witness or witness_settings.load()
        self.callout = auth_callout.load_settings() if callout is None else callout or None
        """Per-session NATS identities (``GT_AUTH_ISSUER_SEED``, ...): the witness mints each session's credential
        and answers the server's auth callout; None: sessions get ``GT_AGENT_NATS_*`` (or the witness's own)."""
        self.responder: auth_callout.Responder | None = None
        self._kicker: Connection | None = None
        """The ``sys`` user's connection, when ``GT_NATS_SYS_PASSWORD`` is set: disconnects ended sessions."""
        self._kicking: dict[str, asyncio.Task[int]] = {}
        ws = self.witness_settings
        self.tmux = Tmux(ws.tmux_socket, town=town_mark(config))  # only our town's sessions, on a shared socket
        self.policy = Policy(
            rigs_root=str(config.gt_home / "rigs"),
            min_orphan_age_s=ws.min_orphan_age_s,
            done_stuck_after_s=ws.done_stuck_after_s,
            done_exit_grace_s=ws.done_exit_grace_s,
            mass_death_count=ws.mass_death_count,
            mass_death_window_s=ws.mass_death_window_s,
            respawn_backoff_s=ws.respawn_backoff_s,
            respawn_backoff_max_s=ws.respawn_backoff_max_s,
            respawn_backoff_reset_s=ws.respawn_backoff_reset_s,
            max_start_failures=ws.max_start_failures,
            start_confirm_s=ws.start_confirm_s,
            rigs=ws.rigs,
        )
        self.executor = Executor(self, self.tmux, ws, self.policy)
        self.exits = ExitWatcher(self.wake_now)
        self._queue: asyncio.PriorityQueue[tuple[int, int, Action]] | None = None
        self._order = itertools.count()
        self._pending: dict[str, Action] = {}
        """Actions queued or running, by key."""
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._screen_seen: dict[str, tuple[str | None, datetime]] = {}
        """Session -> the activity its screen showed last (a retry status) and when it last changed."""
        self._lease_renewed: dict[str, datetime] = {}
        """Session -> when this witness last renewed its hook lease on its busy agent's behalf (plan/liveness.py)."""
        self.actions_done = 0
        self.action_errors = 0
        self._observed = 0
        """Sessions the last observation looked at (``reconcile_gap_s``)."""

    @property
    def state(self) -> WitnessState:
        return self.projection.state

    @property
    def identity(self) -> str:
        return scope.identity(self.witness_settings.rigs)

    def _serves(self, rig: str | None) -> bool:
        return scope.serves(self.witness_settings.rigs, rig)

    # ---- commands ------------------------------------------------------------------------------

    def decide(self, cmd: Command, ctx: DecideContext) -> Accepted:
        return witness_decide.decide(self.projection.state, cmd, ctx)

    def aggregate_key(self, cmd: Command) -> str | None:
        return witness_decide.aggregate_key(cmd)

    def route(self, cmd: Command) -> Route:
        return scope.route(self.state, cmd, self.witness_settings.rigs)

    async def prepare(self, cmd: Command) -> object:
        if isinstance(cmd, RigAdd) and cmd.name not in self.state.rigs:
            # Looked at before deciding (decisions do no I/O): can git read it, has it the base branch?
            problem = await asyncio.to_thread(git.probe_repository, cmd.repo, cmd.base_branch)
            return witness_decide.RepoFacts(problem)
        if isinstance(cmd, SessionRecoverHook):
            last = witness_decide.last_session_of(self.state, cmd.bead)
            if last is None or last.worktree_removed:
                return witness_decide.WorktreeFacts(None)
            rig = self.state.rigs.get(last.rig)
            return witness_decide.WorktreeFacts(
                await asyncio.to_thread(_work_at_risk, last.worktree, last.branch, rig.base_branch if rig else "main")
            )
        return None

    def query(self, query: Query[Any]) -> Any:
        return queries.answer(self.projection.state, query)

    def check_session_query(self, query: Query[Any], session: str) -> None:
        queries.check_session_query(query, session)

    def status(self) -> WitnessStatus:
        return WitnessStatus(
            **msgspec.structs.asdict(super().status()),
            actions_done=self.actions_done,
            action_errors=self.action_errors,
            actions_pending=len(self._pending),
            watched_processes=len(self.exits),
            tmux_socket=self.witness_settings.tmux_socket,
            rigs=sorted(self.witness_settings.rigs) if self.witness_settings.rigs is not None else None,
            commands_passed=self.intake.passed if self.intake else 0,
            session_logins_granted=self.responder.granted if self.responder else None,
            session_logins_refused=self.responder.refused if self.responder else None,
            session_connections_kicked=self.responder.kicked if self.responder else None,
        )

    # ---- the control loop ----------------------------------------------------------------------

    def start_background(self, tg: asyncio.TaskGroup) -> None:
        self._queue = asyncio.PriorityQueue()
        for n in range(self.witness_settings.workers):
            tg.create_task(self._worker(), name=f"witness-worker-{n}")
        usage = UsageWatch(
            self,
            self.executor.session_dir,
            self._serves,
            interval_s=self.witness_settings.usage_interval_s,
            clock=self.clock,
        )
        tg.create_task(usage.run(poll_s=min(1.0, self.witness_settings.usage_interval_s or 1.0)), name="usage-watch")
        if self.callout is not None:
            tg.create_task(self._answer_auth_callout(self.callout), name="auth-callout")

    def reconcile_gap_s(self) -> float:
        # Its reconcile observes every session (tmux, processes, files): 200 sessions starting at once would have
        # it observe after every few events. So the next waits a little, more the more sessions each observation
        # reads (200: 50 ms; 5: about 1 ms); a death does not wait (``wake_now``).
        return min(RECONCILE_GAP_MAX_S, RECONCILE_GAP_PER_SESSION_S * self._observed)

    def session_live(self, session_id: str) -> bool:
        """May this session log in: the witness knows it and it has not ended (then its credential is dead)."""
        session = self.state.sessions.get(session_id)
        return session is not None and session.status != "ended"

    async def _answer_auth_callout(self, settings: auth_callout.CalloutSettings) -> None:
        """The auth callout responder, on its own connection as the ``auth`` user. A bad request is answered and
        logged (``Responder``); anything else ends the witness's task group, as any of its loops would."""
        config = msgspec.structs.replace(
            self.config,
            nats_user=auth_callout.AUTH_USER,
            nats_password=settings.auth_password,
            nats_creds=None,
            nats_inbox_prefix=None,
        )
        buckets = SessionBuckets(self.config.evt_stream, self.config.heartbeat_bucket, self.config.lease_bucket)
        self.responder = auth_callout.Responder(settings, buckets, self.session_live)
        nc = await connect(config, name=f"{self.identity}-auth-callout", connect_attempts=-1)
        try:
            if settings.sys_password:
                sys_config = msgspec.structs.replace(
                    config, nats_user=auth_callout.SYS_USER, nats_password=settings.sys_password
                )
                self._kicker = await connect(sys_config, name=f"{self.identity}-kicker", connect_attempts=-1)
            await self.responder.serve(nc)
        finally:
            await close_quietly(nc)
            if self._kicker is not None:
                await close_quietly(self._kicker)
                self._kicker = None

    async def _kick_ended_sessions(self) -> None:
        """Level-triggered: every connection this witness granted to a session that has ended since is cut."""
        if self.responder is None or self._kicker is None:
            return
        for session in [s for s in self.responder.connections if not self.session_live(s)]:
            if session in self._kicking:
                continue
            # In the background: a session may have logged in many times, and the reconcile must not wait.
            task = asyncio.create_task(self.responder.kick(self._kicker, session), name=f"kick-{session}")
            self._kicking[session] = task
            task.add_done_callback(lambda _, s=session: self._kicking.pop(s, None))  # type: ignore[misc]

    async def reconcile(self) -> None:
        if self._queue is None:
            return
        observed = await self._observe()
        for action in plan(self.state, observed, self.policy):
            self._queue_action(action)
        await self._kick_ended_sessions()

    def _queue_action(self, action: Action) -> None:
        assert self._queue is not None
        if action.key in self._pending or self._retry_at.get(action.key, 0.0) > time.monotonic():
            return
        self._pending[action.key] = action
        self._queue.put_nowait((action.PRIORITY, next(self._order), action))

    async def _worker(self) -> None:
        assert self._queue is not None
        while True:
            raise_if_cancelling()  # an action's NATS call may have swallowed the cancel meant for this worker
            _, _, action = await self._queue.get()
            try:
                await self.wait_active()  # an action touches tmux and git before it writes: never once standing down
                await self.executor.run(action)
            except ActivityLostError:
                raise
            except StartBlockedError as exc:
                log.info("start_blocked", key=action.key, reason=str(exc))
                self._back_off(action.key, minimum=1.0)
            except Exception:
                # One failed action (git, tmux, NATS, a bug) must not stop the witness: it is logged with its
                # traceback and retried with backoff by the next plan. Cancellation is not caught.
                self.action_errors += 1
                log.exception("action_failed", action=type(action).__name__, key=action.key)
                self._back_off(action.key)
            else:
                self.actions_done += 1
                self._failures.pop(action.key, None)
                self._retry_at.pop(action.key, None)
            finally:
                self._pending.pop(action.key, None)
                self.wake()

    def _back_off(self, key: str, minimum: float = 0.5) -> None:
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = min(MAX_RETRY_DELAY_S, max(minimum, 0.5 * 2 ** (failures - 1)))
        self._retry_at[key] = time.monotonic() + delay
        asyncio.get_running_loop().call_later(delay, self.wake)

    async def _observe(self) -> Observed:
        as_of = self.projection.last_seq
        # Processes first, tmux second: a tmux session killed in between then reads as gone (dead), and an
        # agent that died in between as a dead pane in a live session (zombie); both are right.
        # Also agents running on after `gt done` ended their session: their exit lets the cleanup go ahead.
        started = [
            s
            for s in self.state.sessions.values()
            if (s.status == "started" or may_linger(s)) and s.pane_pid and self._serves(s.rig)
        ]
        self._observed = len(started)
        refs = {s.id: processes.ProcessRef(pid=s.pane_pid or 0, started=s.pid_started or 0.0) for s in started}
        running = self.exits.running(refs)
        looked_up = {sid: ref for sid, ref in refs.items() if sid not in running}
        alive = await asyncio.to_thread(lambda: {sid: processes.is_alive(ref) for sid, ref in looked_up.items()})
        alive.update(dict.fromkeys(running, True))
        panes: dict[str, PaneSeen] | None
        try:
            snapshot = await asyncio.to_thread(self.tmux.snapshot)
            panes = {
                name: PaneSeen(
                    name=name, pane_pid=p.pane_pid, dead=p.dead, created=p.created, label=p.label, activity=p.activity
                )
                for name, p in snapshot.items()
            }
        except TmuxError as exc:
            log.warning("tmux_unavailable", error=str(exc))
            panes = None
        for sid, ref in refs.items():
            if alive[sid]:
                self.exits.watch(sid, ref)
        self.exits.keep_only({sid for sid, ok in alive.items() if ok})
        now = self.clock()
        quiet = self._quiet_sessions(now)
        activity = await asyncio.to_thread(self._runtime_activity, quiet)
        confirmed = await asyncio.to_thread(self._start_confirmed, started)
        screens = await asyncio.to_thread(self._read_screens, [s for s in started if s.status == "started"], confirmed)
        for sid, at in self._screen_activity(screens, now).items():
            activity[sid] = max(at, activity.get(sid, at))
        await self._renew_hooks_of_busy_agents(activity, now)
        return Observed(
            now=now,
            as_of_seq=as_of,
            panes=panes,
            alive=alive,
            heartbeats=await self._heartbeats_of(quiet, now),
            activity=activity,
            start_confirmed=confirmed,
            refused={sid: seen.refused for sid, seen in screens.items() if seen.refused is not None},
            blocked={sid: seen.blocked for sid, seen in screens.items() if seen.blocked is not None},
            idle=frozenset(sid for sid, seen in screens.items() if seen.idle),
            restarts={sid: seen.restart for sid, seen in screens.items() if seen.restart is not None},
            reported_done=await asyncio.to_thread(self._reported_done, [s for s in started if may_linger(s)]),
            start_failures=dict(self.executor.start_failures),
            busy=frozenset(self._pending) | {k for k, t in self._retry_at.items() if t > time.monotonic()},
            reserved=frozenset((a.rig, a.polecat) for a in self._pending.values() if isinstance(a, Spawn)),
            acting_since=self.acting_since,
        )

    def _start_confirmed(self, started: list[Session]) -> frozenset[str]:
        """Of the started sessions whose runtime confirms its start, those whose start hook left its mark."""
        confirming = [
            s for s in started if (rig := self.state.rigs.get(s.rig)) is not None and confirms_start(rig.agent_command)
        ]
        return frozenset(s.id for s in confirming if runtime_setup.started(self.executor.session_dir(s)))

    def _reported_done(self, lingering: list[Session]) -> frozenset[str]:
        """Of the sessions ended by `gt done` whose agent still runs, those whose agent ended a turn since (its hook
        log: one small read each, only during ``done_exit_grace_s``)."""
        return frozenset(
            s.id for s in lingering if turn_ended_after_done(runtime_setup.hook_log(self.executor.session_dir(s)))
        )

    def _read_screens(self, started: list[Session], confirmed: frozenset[str]) -> dict[str, ScreenSeen]:
        """What the panes of started sessions whose runtime reads its screen show (one ``tmux capture-pane`` each per
        patrol), as their runtime reads it: a refused key (or its StopFailure hook's record), a screen waiting for
        input before the start was confirmed, activity only the screen shows, idle at its prompt, and (idle only:
        its hook log is read then) a restart with a fresh context after which it waits."""
        out: dict[str, ScreenSeen] = {}
        for s in started:
            rig = self.state.rigs.get(s.rig)
            if rig is None:
                continue
            runtime = runtime_for(rig.agent_command)
            if not runtime.reads_screen:
                continue
            session_dir = self.executor.session_dir(s)
            screen = self._screen(s)
            idle = bool(runtime.idle(screen))
            out[s.id] = ScreenSeen(
                refused=runtime.refusal(runtime_setup.agent_failure(session_dir), screen),
                blocked=runtime.blocking_screen(screen) if s.id not in confirmed else None,
                activity=runtime.activity_on_screen(screen),
                idle=idle,
                restart=runtime.restart(runtime_setup.hook_log(session_dir)) if idle else None,
                read=bool(screen),
            )
        return out

    def _screen_activity(self, screens: dict[str, ScreenSeen], now: datetime) -> dict[str, datetime]:
        """When each session's on-screen activity (a retry status) last changed: what the screen shows counts as a
        sign of life only while it changes (a frozen agent shows a frozen status). Its going away is a change too
        (the request was answered), and the moment stays a sign of life until the next one: the agent's own signs
        (a tool call, its transcript) may show up a patrol later."""
        for sid in [sid for sid in self._screen_seen if sid not in screens]:
            del self._screen_seen[sid]  # no longer started
        for sid, seen in screens.items():
            if not seen.read:
                continue
            previous = self._screen_seen.get(sid)
            if (previous is None and seen.activity is not None) or (
                previous is not None and previous[0] != seen.activity
            ):
                self._screen_seen[sid] = (seen.activity, now)
        return {sid: at for sid, (_, at) in self._screen_seen.items()}

    def _screen(self, session: Session) -> str:
        """The bottom of the session's pane (where Claude Code shows a request it is retrying, its prompt, a
        dialog), or ''."""
        try:
            return self.tmux.capture(session.tmux_name, lines=SCREEN_LINES)
        except TmuxError:
            return ""

    def _quiet_sessions(self, now: datetime) -> list[Session]:
        """Started sessions whose events alone (start, step progress) are older than half their stall limit or
        half their hook lease's TTL: only for these are heartbeats and activity read (a few stats each)."""
        quiet = []
        for session in self.state.sessions.values():
            rig = self.state.rigs.get(session.rig)
            bead = self.state.beads.get(session.bead)
            if session.status != "started" or rig is None or bead is None or not self._serves(session.rig):
                continue
            limit = rig.stall_after_s
            if (hook := self.state.hooks.get(hook_lease_name(session.bead))) is not None:
                limit = min(limit, hook.ttl_s)
            last = max(m for m in (session.started_at, bead.last_progress_at, session.requested_at) if m)
            if (now - last).total_seconds() > limit / 2:
                quiet.append(session)
        return quiet

    def _runtime_activity(self, sessions: list[Session]) -> dict[str, datetime]:
        """The newest mtime of each session's runtime activity files (hook marks, transcripts)."""
        out: dict[str, datetime] = {}
        for session in sessions:
            rig = self.state.rigs.get(session.rig)
            if rig is None:
                continue
            newest = runtime_setup.last_activity(
                self.executor.session_dir(session), runtime_for(rig.agent_command).activity_files
            )
            if newest is not None:
                out[session.id] = newest
        return out

    async def _renew_hooks_of_busy_agents(self, activity: dict[str, datetime], now: datetime) -> None:
        """Renew the hook lease of sessions whose agent is busy with its own tools (see ``liveness``)."""
        self._lease_renewed = {sid: at for sid, at in self._lease_renewed.items() if sid in self.state.sessions}
        owed = liveness.renewals_owed(self.state, activity, self._lease_renewed, now)
        if not owed or self.nc is None:
            return
        try:
            kv = Bucket(self.nc, self.config.lease_bucket)
            for renewal in owed:
                try:
                    await leases.renew(kv, renewal.lease, renewal.session, renewal.token, now)
                except leases.LeaseLostError as exc:
                    # Fenced out already (expired, or a newer session holds it): the plan warrants the session.
                    log.info("hook_lease_not_renewed_for_agent", session=renewal.session, why=exc.why)
                    continue
                self._lease_renewed[renewal.session] = now
                log.debug("hook_lease_renewed_for_agent", session=renewal.session, lease=renewal.lease)
        except (BusError, TimeoutError) as exc:
            log.warning("hook_lease_renewal_failed", error=repr(exc))

    async def _heartbeats_of(self, sessions: list[Session], now: datetime) -> dict[str, datetime]:
        """The `gt heartbeat` of each of ``sessions`` (the quiet ones)."""
        quiet = [s.id for s in sessions]
        if not quiet or self.nc is None:
            return {}
        out: dict[str, datetime] = {}
        try:
            kv = Bucket(self.nc, self.config.heartbeat_bucket)
            for sid in quiet:
                entry = await kv.get(sid)
                if entry is None:
                    continue
                beat = heartbeats.decode_agent(entry.value)
                if beat is not None:
                    out[sid] = beat.ts
        except (BusError, TimeoutError) as exc:
            # Without heartbeats a quiet session could be judged stalled wrongly: judge none this time.
            log.warning("heartbeats_unavailable", error=repr(exc))
            return dict.fromkeys(quiet, now)
        return out

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            self.exits.close()


def _work_at_risk(worktree: str, branch: str, base: str) -> str | None:
    """What a re-sling could lose in the session's worktree (None: nothing, or the worktree is another's now)."""
    try:
        state = git.worktree_state(Path(worktree), base)
    except git.GitError as exc:
        return f"a worktree git cannot read ({exc})"
    if not state.exists or state.branch != branch:
        return None
    parts = []
    if state.dirty:
        parts.append("uncommitted changes")
    if state.unpushed:
        parts.append(f"{state.unpushed} unpushed commit{'s' if state.unpushed != 1 else ''}")
    return " and ".join(parts) or None
