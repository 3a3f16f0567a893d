"""The deacon service: service liveness (from heartbeats), TTL leases (acquire, release, expire), and the town's
housekeeping. Its watch runs on its own tick, independent of the patrol, so a dead service or an expired lease
is noticed within a tick."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

import structlog

from services.deacon import leases, liveness
from services.deacon import settings as deacon_settings
from services.deacon.automation_runner import AutomationRunner
from services.deacon.automations import AutomationSettings, load_settings
from services.deacon.projection import new_projection
from services.deacon.state import DeaconState
from services.deacon.supervision import Supervision
from shared.commands import AutomationRun, Command, LeaseAcquire, LeaseRelease
from shared.config import TownConfig
from shared.decision import Accepted, DecideContext
from shared.errors import CommandError, QueryError
from shared.service import Service, ServiceSettings

log = structlog.get_logger(__name__)


class DeaconService(Service[DeaconState]):
    name: ClassVar[str] = "deacon"

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
            send_command=self._send,
            clock=clock,
        )
        self.watch_errors = 0
        self.automations = AutomationRunner(
            config=config,
            settings=automations or load_settings(os.environ, config.gt_home),
            state=lambda: self.projection.state.automations,
            last_seq=lambda: self.projection.last_seq,
            append_owed=self.append_owed,
            send_command=self._send,
            clock=clock,
            wake=self.wake,
            holder=f"deacon-{self.instance}",
        )

    async def _send(self, subject: str, body: dict[str, object], cmd_id: str) -> int:
        return await self.send_command(subject, dict(body), cmd_id=cmd_id)

    # ---- commands and queries ------------------------------------------------------------------

    def decide(self, cmd: Command, ctx: DecideContext) -> Accepted:
        state = self.projection.state
        if isinstance(cmd, LeaseAcquire):
            return leases.acquire(state.leases, cmd, ctx.now)
        if isinstance(cmd, LeaseRelease):
            return leases.release(state.leases, cmd)
        if isinstance(cmd, AutomationRun):
            return self.automations.decide(cmd, ctx)
        raise CommandError("unknown_command", f"the deacon does not handle {cmd.SUBJECT}")

    def aggregate_key(self, cmd: Command) -> str | None:
        if isinstance(cmd, LeaseAcquire | LeaseRelease):
            return f"lease:{cmd.lease}"
        if isinstance(cmd, AutomationRun):
            return f"automation:{cmd.name}"
        return None

    async def prepare(self, cmd: Command) -> object:
        if isinstance(cmd, AutomationRun):
            return self.automations.lookup(cmd.name)  # the file as it reads now: deciding does no I/O
        return None

    def query(self, what: str, body: dict[str, Any]) -> Any:
        state = self.projection.state
        if what == "services":
            return [
                {
                    "service": life.name,
                    "status": life.status,
                    "instance": life.instance,
                    "since": life.since.isoformat(),
                    "reason": life.reason,
                }
                for life in sorted(state.liveness.services.values(), key=lambda x: x.name)
            ]
        if what == "leases":
            held_only = bool(body.get("held", False))
            return [
                leases.view(lease)
                for lease in sorted(state.leases.leases.values(), key=lambda x: x.name)
                if not held_only or lease.status == "held"
            ]
        if what == "lease":
            name = body.get("name")
            if not isinstance(name, str) or not name:
                raise QueryError("invalid", "`name` is required")
            lease = state.leases.leases.get(name)
            if lease is None:
                raise QueryError("not_found", f"no lease {name!r}")
            renewal, _ = self.supervision.renewal_of(name)
            return {**leases.view(lease), "last_renewed": leases.last_renewed(lease, renewal).isoformat()}
        if what in ("automations", "automation"):
            return self.automations.query(what, body)
        raise QueryError(
            "unknown_query",
            f"the deacon has no query {what!r}; it answers services, leases, lease, automations, automation, status",
        )

    def status(self) -> dict[str, Any]:
        out = super().status()
        state = self.projection.state
        out.update(
            services={name: life.status for name, life in sorted(state.liveness.services.items())},
            leases_held=sum(1 for lease in state.leases.leases.values() if lease.status == "held"),
            leases_expired=self.supervision.expired,
            watch_errors=self.watch_errors,
        )
        out.update(self.automations.status())
        return out

    # ---- the watch ------------------------------------------------------------------------------

    def start_background(self, tg: asyncio.TaskGroup) -> None:
        assert self.nc is not None
        self.supervision.start(tg, self.nc.jetstream())
        self.automations.start(tg, self.nc.jetstream())
        tg.create_task(self._watch_loop(), name="deacon-watch")

    async def reconcile(self) -> None:
        await self.automations.reconcile()

    async def _watch_loop(self) -> None:
        while True:
            state = self.projection.state
            try:
                await self.supervision.check_services(state.liveness)
                await self.supervision.expire_leases(state.leases)
            except Exception:
                # A failed tick (NATS hiccup, a bug) is logged with its traceback; the next tick looks again.
                # Cancellation is not an Exception and passes.
                self.watch_errors += 1
                log.exception("deacon_watch_failed")
            await asyncio.sleep(self.watch.tick_s)
