"""What the witness observes before each plan (``plan.Observed``): which agents still run (pidfds, ``/proc``), the
tmux sessions, what started sessions' panes show as their runtime reads it, their hook marks and activity files,
and the `gt heartbeat` of the quiet ones.

One write happens here too, because it follows from what was just seen: the hook lease of a session whose agent is
busy with its own tools is renewed on its behalf (``plan/liveness.py`` says which).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Protocol

import msgspec
import structlog

from services.witness.effects import runtime_setup, town_agent
from services.witness.effects.pidwatch import ExitWatcher
from services.witness.plan import Observed, PaneSeen, liveness, may_linger, scope
from services.witness.plan.observed import TownAgentSeen
from services.witness.plan.town_agents import delivered_ask
from services.witness.state import Session, TownAgent, WitnessState, agent_of
from shared.bus import lease_kv as leases
from shared.bus.connection import Connection
from shared.bus.errors import BusError
from shared.bus.kv import Bucket
from shared.core.config import TownConfig
from shared.core.ids import hook_lease_name
from shared.host import processes
from shared.host.tmux import Tmux, TmuxError
from shared.model import heartbeats
from shared.model.runtimes import Restart, confirms_start, runtime_for, turn_ended_after_done
from shared.service.projection import Projection

log = structlog.get_logger(__name__)

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


class Watcher(Protocol):
    """What the observation needs of the witness service."""

    config: TownConfig
    clock: Callable[[], datetime]
    nc: Connection | None
    projection: Projection[WitnessState]
    acting_since: datetime | None


class InFlight(Protocol):
    """The witness's actions queued or running (``effects/actions.py``): the plan leaves their keys alone."""

    def busy(self) -> frozenset[str]: ...

    def reserved(self) -> frozenset[tuple[str, str]]: ...


class Observer:
    def __init__(
        self,
        host: Watcher,
        tmux: Tmux,
        exits: ExitWatcher,
        session_dir: Callable[[Session], Path],
        rigs: frozenset[str] | None,
        start_confirm_s: float,
    ) -> None:
        self.host = host
        self.start_confirm_s = start_confirm_s
        """How long a runtime may take to confirm its start (``GT_AGENT_START_TIMEOUT``): its start is its sign of
        life meanwhile (``liveness.still_starting``)."""
        self.tmux = tmux
        self.exits = exits
        self.session_dir = session_dir
        self.rigs = rigs
        """The witness's scope (``GT_WITNESS_RIGS``): only these rigs' sessions are observed; None: all."""
        self._screen_seen: dict[str, tuple[str | None, datetime]] = {}
        """Session -> the activity its screen showed last (a retry status) and when it last changed."""
        self._lease_renewed: dict[str, datetime] = {}
        """Session -> when this witness last renewed its hook lease on its busy agent's behalf (plan/liveness.py)."""
        self.observed = 0
        """Sessions the last observation looked at (``reconcile_gap_s``)."""

    @property
    def state(self) -> WitnessState:
        return self.host.projection.state

    def _serves(self, rig: str | None) -> bool:
        return scope.serves(self.rigs, rig)

    async def observe(self, in_flight: InFlight, start_failures: Mapping[str, int]) -> Observed:
        """``start_failures``: the executor's, read when the observation is done, as the queue's keys are."""
        as_of = self.host.projection.last_seq
        # Processes first, tmux second: a tmux session killed in between then reads as gone (dead), and an
        # agent that died in between as a dead pane in a live session (zombie); both are right.
        # Also agents running on after `gt done` ended their session: their exit lets the cleanup go ahead.
        started = [
            s
            for s in self.state.sessions.values()
            if (s.status == "started" or may_linger(s)) and s.pane_pid and self._serves(s.rig)
        ]
        self.observed = len(started)
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
        now = self.host.clock()
        quiet = self._quiet_sessions(now)
        activity = await asyncio.to_thread(self._runtime_activity, quiet)
        confirmed = await asyncio.to_thread(self._start_confirmed, started)
        screens = await asyncio.to_thread(self._read_screens, [s for s in started if s.status == "started"], confirmed)
        for sid, at in self._screen_activity(screens, now).items():
            activity[sid] = max(at, activity.get(sid, at))
        for session in started:
            if self._still_starting(session, confirmed, now):
                activity[session.id] = now
        await self._renew_hooks_of_busy_agents(activity, now)
        town_agents = await asyncio.to_thread(self._town_agents, panes) if panes is not None else {}
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
            start_failures=dict(start_failures),
            busy=in_flight.busy(),
            reserved=in_flight.reserved(),
            acting_since=self.host.acting_since,
            town_agents=town_agents,
        )

    def _town_agents(self, panes: dict[str, PaneSeen]) -> dict[str, TownAgentSeen]:
        """What each town agent's session shows (a witness of every rig only): its pane, whether its recorded
        process runs; when a request waits, whether it is at its prompt; when one was delivered, its answer."""
        if self.rigs is not None:
            return {}
        out: dict[str, TownAgentSeen] = {}
        for agent in self.state.town_agents.values():
            pane = panes.get(agent.tmux_name)
            if pane is None or pane.label != agent.user:
                out[agent.name] = TownAgentSeen()
                continue
            alive = agent.wanted and not pane.dead and pane.pane_pid == agent.pane_pid
            seen = TownAgentSeen(pane=True, alive=alive)
            try:
                if alive and (agent.asks or agent.notices):
                    seen = self._town_agent_seen(agent, seen)
            except (TmuxError, OSError, RecursionError, ValueError) as exc:
                # What its files or pane hold is the agent's: never the witness's patrol to fail on.
                log.warning("town_agent_unreadable", agent=agent.name, error=repr(exc)[:300])
            out[agent.name] = seen
        return out

    def _town_agent_seen(self, agent: TownAgent, seen: TownAgentSeen) -> TownAgentSeen:
        """A running town agent with requests or notices: the delivered request's answer, or whether its runtime
        took it in; whether it waits at its prompt, having ended a turn of this run (a runtime shows its prompt
        before its first turn, the beacon's, begins: typed then, a request could be lost)."""
        home = self.host.config.gt_home
        if (ask := delivered_ask(agent)) is not None:
            answer, received = town_agent.answer_seen(home, agent, ask)
            if answer is not None or received:
                return msgspec.structs.replace(seen, answer=answer)
        else:
            received = True
        screen = self.tmux.capture(agent.tmux_name, lines=SCREEN_LINES)
        idle = bool(runtime_for(agent.agent).idle(screen)) and town_agent.turn_ended(home, agent)
        return msgspec.structs.replace(seen, idle=idle, received=received)

    def _still_starting(self, session: Session, confirmed: frozenset[str], now: datetime) -> bool:
        rig = self.state.rigs.get(session.rig)
        return rig is not None and liveness.still_starting(
            session,
            confirms_start=confirms_start(agent_of(session, rig)),
            confirmed=session.id in confirmed,
            now=now,
            deadline_s=self.start_confirm_s,
        )

    def _start_confirmed(self, started: list[Session]) -> frozenset[str]:
        """Of the started sessions whose runtime confirms its start, those whose start hook left its mark."""
        confirming = [
            s for s in started if (rig := self.state.rigs.get(s.rig)) is not None and confirms_start(agent_of(s, rig))
        ]
        return frozenset(s.id for s in confirming if runtime_setup.started(self.session_dir(s)))

    def _reported_done(self, lingering: list[Session]) -> frozenset[str]:
        """Of the sessions ended by `gt done` whose agent still runs, those whose agent ended a turn since (its hook
        log: one small read each, only during ``done_exit_grace_s``)."""
        return frozenset(s.id for s in lingering if turn_ended_after_done(runtime_setup.hook_log(self.session_dir(s))))

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
            runtime = runtime_for(agent_of(s, rig))
            if not runtime.reads_screen:
                continue
            session_dir = self.session_dir(s)
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
                self.session_dir(session), runtime_for(agent_of(session, rig)).activity_files
            )
            if newest is not None:
                out[session.id] = newest
        return out

    async def _renew_hooks_of_busy_agents(self, activity: dict[str, datetime], now: datetime) -> None:
        """Renew the hook lease of sessions whose agent is busy with its own tools (see ``liveness``)."""
        self._lease_renewed = {sid: at for sid, at in self._lease_renewed.items() if sid in self.state.sessions}
        owed = liveness.renewals_owed(self.state, activity, self._lease_renewed, now)
        if not owed or self.host.nc is None:
            return
        try:
            kv = Bucket(self.host.nc, self.host.config.lease_bucket)
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
        if not quiet or self.host.nc is None:
            return {}
        out: dict[str, datetime] = {}
        try:
            kv = Bucket(self.host.nc, self.host.config.heartbeat_bucket)
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
