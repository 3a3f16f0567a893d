"""The witness service: rigs, polecat sessions (spawn, watch, warrant, recover), nudges.

Wiring only. Each reconcile observes tmux, the agents' processes and (for quiet sessions) their heartbeats
(``effects/observe.py``), asks the pure planner what is owed (``plan``), and queues those actions
(``effects/actions.py``); a few workers carry them out (``effects/executor.py``). An agent's death wakes the
witness at once through a pidfd; the patrol tick finds everything else. The sessions' logins: ``effects/auth.py``.

A witness may serve only some rigs (``GT_WITNESS_RIGS``, see ``plan/scope.py``): it then observes, plans and acts
for those alone and settles only their commands; its scope is its identity for activity and liveness.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, TypeVar

import msgspec

from services.witness import decide as witness_decide
from services.witness import queries
from services.witness import settings as witness_settings
from services.witness.effects import probes
from services.witness.effects.actions import ActionQueue
from services.witness.effects.auth import SessionLogins
from services.witness.effects.executor import Executor
from services.witness.effects.observe import Observer
from services.witness.effects.pidwatch import ExitWatcher
from services.witness.effects.usage_watch import UsageWatch
from services.witness.plan import Policy, plan, scope
from services.witness.projection import new_projection
from services.witness.state import WitnessState
from shared.bus import auth_callout
from shared.bus import query as bus_query
from shared.core.config import TownConfig, town_mark
from shared.host.tmux import Tmux
from shared.model.commands import Command, TownAgentStart
from shared.model.decision import Accepted, DecideContext, Route
from shared.model.queries import Query
from shared.model.queries.witness import WitnessStatus
from shared.service import Service, ServiceSettings

R = TypeVar("R")

RECONCILE_GAP_PER_SESSION_S = 0.00025
RECONCILE_GAP_MAX_S = 0.05


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
        self.witness_settings = ws = witness or witness_settings.load()
        self.callout = auth_callout.load_settings() if callout is None else callout or None
        """Per-session NATS identities (``GT_AUTH_ISSUER_SEED``, ...): the witness mints each session's credential
        and answers the server's auth callout; None: sessions get ``GT_AGENT_NATS_*`` (or the witness's own)."""
        self.logins = SessionLogins(config, self.callout, lambda: self.state) if self.callout is not None else None
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
            context_handoff_at=ws.context_handoff_at,
            gate_quiet_s=ws.gate_quiet_s,
        )
        self.executor = Executor(self, self.tmux, ws, self.policy)
        self.exits = ExitWatcher(self.wake_now)
        self.actions = ActionQueue(self, self.executor)
        self.observer = Observer(self, self.tmux, self.exits, self.executor.session_dir, ws.rigs, ws.start_confirm_s)

    @property
    def state(self) -> WitnessState:
        return self.projection.state

    @property
    def identity(self) -> str:
        return scope.identity(self.witness_settings.rigs)

    @property
    def responder(self) -> auth_callout.Responder | None:
        """The auth callout's responder, once it serves."""
        return self.logins.responder if self.logins is not None else None

    @property
    def actions_done(self) -> int:
        return self.actions.done

    @property
    def action_errors(self) -> int:
        return self.actions.errors

    def _serves(self, rig: str | None) -> bool:
        return scope.serves(self.witness_settings.rigs, rig)

    # ---- commands ------------------------------------------------------------------------------

    def decide(self, cmd: Command, ctx: DecideContext) -> Accepted:
        return witness_decide.decide(self.projection.state, cmd, ctx)

    def route(self, cmd: Command) -> Route:
        return scope.route(self.state, cmd, self.witness_settings.rigs)

    async def prepare(self, cmd: Command) -> object:
        if isinstance(cmd, TownAgentStart):
            return witness_decide.TownAgentFacts(self.executor.town_agents.problem())
        return await probes.facts_for(self.state, cmd, self.policy.rigs_root)

    def query(self, query: Query[Any]) -> Any:
        return queries.answer(self.projection.state, query)

    def check_session_query(self, query: Query[Any], session: str) -> None:
        queries.check_session_query(self.projection.state, query, session)

    async def read(self, query: Query[R], /) -> R:
        """Ask ``query`` as of everything this witness applied: its own from its projection, another service's
        over the bus (answered once that service applied as much), a list to its end."""
        query = msgspec.structs.replace(query, min_seq=self.projection.last_seq)
        if query.addressee() == self.name:
            return bus_query.reply_of(query, msgspec.to_builtins(self.query(query)))
        assert self.nc is not None
        if hasattr(query, "after"):
            return bus_query.reply_of(query, (await bus_query.ask_all(self.nc, query)).items)
        return await bus_query.ask(self.nc, query)

    def status(self) -> WitnessStatus:
        responder = self.responder
        return WitnessStatus(
            **msgspec.structs.asdict(super().status()),
            actions_done=self.actions.done,
            action_errors=self.actions.errors,
            actions_pending=self.actions.pending,
            watched_processes=len(self.exits),
            tmux_socket=self.witness_settings.tmux_socket,
            rigs=sorted(self.witness_settings.rigs) if self.witness_settings.rigs is not None else None,
            commands_passed=self.intake.passed if self.intake else 0,
            session_logins_granted=responder.granted if responder else None,
            session_logins_refused=responder.refused if responder else None,
            session_connections_kicked=responder.kicked if responder else None,
        )

    # ---- the control loop ----------------------------------------------------------------------

    def start_background(self, tg: asyncio.TaskGroup) -> None:
        self.actions.start(tg, self.witness_settings.workers)
        usage = UsageWatch(
            self,
            self.executor.session_dir,
            self._serves,
            interval_s=self.witness_settings.usage_interval_s,
            clock=self.clock,
        )
        tg.create_task(usage.run(poll_s=min(1.0, self.witness_settings.usage_interval_s or 1.0)), name="usage-watch")
        if self.logins is not None:
            tg.create_task(self.logins.serve(self.identity), name="auth-callout")

    def reconcile_gap_s(self) -> float:
        # Its reconcile observes every session (tmux, processes, files): 200 sessions starting at once would have
        # it observe after every few events. So the next waits a little, more the more sessions each observation
        # reads (200: 50 ms; 5: about 1 ms); a death does not wait (``wake_now``).
        return min(RECONCILE_GAP_MAX_S, RECONCILE_GAP_PER_SESSION_S * self.observer.observed)

    async def reconcile(self) -> None:
        if not self.actions.started:
            return
        observed = await self.observer.observe(self.actions, self.executor.start_failures)
        for action in plan(self.state, observed, self.policy):
            self.actions.put(action)
        if self.logins is not None:
            await self.logins.kick_ended_sessions()

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            self.exits.close()
