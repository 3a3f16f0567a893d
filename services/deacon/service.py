"""The deacon service: wiring. Its watch (service liveness, lease expiry, stale hooks, sweeps, the disk alarm:
``effects.housekeeping``) is the base's ``tick``, on its own clock beside the patrol; the patrol runs the
operator's automations (``automations.runner``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

import msgspec

from services.deacon import decide as deacon_decide
from services.deacon import queries
from services.deacon import settings as deacon_settings
from services.deacon.automations.definitions import AutomationSettings, load_settings
from services.deacon.automations.runner import AutomationRunner
from services.deacon.effects.gate_checks import GateChecks
from services.deacon.effects.gc_kv import Purged
from services.deacon.effects.housekeeping import Housekeeping
from services.deacon.effects.supervision import Supervision
from services.deacon.plan import liveness
from services.deacon.projection import new_projection
from services.deacon.state import DeaconState
from shared.core.config import TownConfig
from shared.core.errors import QueryError
from shared.model.commands import AutomationRun, Command
from shared.model.decision import Accepted, DecideContext
from shared.model.queries import Query, deacon
from shared.model.queries.deacon import DeaconStatus
from shared.service import Service, ServiceSettings


class DeaconService(Service[DeaconState]):
    name: ClassVar[str] = "deacon"
    tick_failed: ClassVar[str] = "deacon_watch_failed"

    def __init__(
        self,
        config: TownConfig,
        settings: ServiceSettings | None = None,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        deacon: deacon_settings.DeaconSettings | None = None,
        automations: AutomationSettings | None = None,
    ) -> None:
        super().__init__(config, new_projection(), settings, clock=clock)
        self.watch = deacon or deacon_settings.load()
        """How the deacon watches; read at every tick (a test may replace it on a running deacon)."""
        policy = liveness.Policy(
            stale_after_s=self.watch.stale_after_s,
            startup_grace_s=self.watch.startup_grace_s,
            escalate_after_s=self.watch.escalate_after_s,
            expected=self.watch.watched,
        )
        self.supervision = Supervision(
            service_bucket=config.service_bucket,
            lease_bucket=config.lease_bucket,
            liveness_policy=policy,
            append_owed=self.append_owed,
            store=self.store,
            clock=clock,
        )
        self.housekeeping = Housekeeping(
            config=config,
            settings=lambda: self.watch,
            state=lambda: self.projection.state,
            supervision=self.supervision,
            append_owed=self.append_owed,
            store=self.store,
            clock=clock,
        )
        self.automations = AutomationRunner(
            config=config,
            settings=automations or load_settings(os.environ, config.gt_home),
            state=lambda: self.projection.state.automations,
            last_seq=lambda: self.projection.last_seq,
            append_owed=self.append_owed,
            store=self.store,
            clock=clock,
            wake=self.wake,
            holder=self.instance,
        )

        self.gate_checks = GateChecks(
            config=config,
            settings=lambda: self.watch,
            gates=lambda: self.projection.state.ci_gates,
            store=self.store,
            clock=clock,
        )

    # ---- commands and queries ------------------------------------------------------------------

    def decide(self, cmd: Command, ctx: DecideContext) -> Accepted:
        return deacon_decide.decide(
            self.projection.state,
            cmd,
            ctx,
            gc_ttl_s=self.watch.gc_ttl_s,
            holder=self.automations.holder,
            grace_s=self.automations.settings.grace_s,
        )

    async def prepare(self, cmd: Command) -> object:
        if isinstance(cmd, AutomationRun):
            return self.automations.lookup(cmd.name)  # the file as it reads now: deciding does no I/O
        return None

    def check_session_query(self, query: Query[Any], session: str) -> None:
        if isinstance(query, deacon.GateChecks):
            # A CI check's command and output are the town's business, not a polecat's (it may print anything).
            raise QueryError("unauthorized", "a polecat session does not read the CI gates' checks")

    def query(self, query: Query[Any]) -> Any:
        if isinstance(query, deacon.GateChecks):
            return self.gate_checks.views()
        if isinstance(query, deacon.Automations | deacon.Automation):
            return self.automations.query(query)  # reads the files: the runner holds them
        return queries.answer(self.projection.state, query, lambda name: self.supervision.renewal_of(name)[0])

    def status(self) -> DeaconStatus:
        state = self.projection.state
        return DeaconStatus(
            **msgspec.structs.asdict(super().status()),
            services={name: life.status for name, life in sorted(state.liveness.services.items())},
            leases_held=sum(1 for lease in state.leases.leases.values() if lease.status == "held"),
            leases_expired=self.supervision.expired,
            watch_errors=self.watch_errors,
            stale_hooks_handed_over=self.housekeeping.stale_hooks,
            gc_last_swept_at=state.gc.last_swept_at.isoformat() if state.gc.last_swept_at else None,
            gc_cutoff=state.gc.cutoff.isoformat() if state.gc.cutoff else None,
            gc_sweeps=state.gc.sweeps,
            gc_kv_purged=msgspec.structs.asdict(self.kv_purged),
            **self.automations.status(),
        )

    # ---- the watch (the base's tick) and the patrol ----------------------------------------------

    def start_background(self, tg: asyncio.TaskGroup) -> None:
        assert self.nc is not None
        self.supervision.start(tg, self.nc)
        self.automations.start(tg, self.nc)
        self.gate_checks.start(tg)
        self.housekeeping.start(self.nc)

    def tick_s(self) -> float:
        return self.watch.tick_s

    async def tick(self) -> None:
        await self.housekeeping.tick()  # it marks leases expired in KV: never once another deacon acts

    async def reconcile(self) -> None:
        self.gate_checks.reconcile()
        await self.automations.reconcile()

    # ---- what tests and bench read ---------------------------------------------------------------

    @property
    def watch_errors(self) -> int:
        """Watch ticks that failed (logged as ``deacon_watch_failed``)."""
        return self.tick_errors

    @property
    def gc_checks(self) -> int:
        return self.housekeeping.gc_checks

    @property
    def kv_swept_seq(self) -> int:
        return self.housekeeping.kv_swept_seq

    @property
    def kv_purged(self) -> Purged:
        return self.housekeeping.kv_purged

    @property
    def disk_checks(self) -> int:
        return self.housekeeping.disk_checks

    def disk_paths(self) -> tuple[str, ...]:
        return self.housekeeping.disk_paths()
