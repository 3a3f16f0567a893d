"""The deacon service: service liveness (from heartbeats), TTL leases (acquire, release, expire), and the town's
housekeeping. Its watch runs on its own tick, independent of the patrol, so a dead service or an expired lease
is noticed within a tick."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

import msgspec
import structlog

from services.deacon import decide as deacon_decide
from services.deacon import queries
from services.deacon import settings as deacon_settings
from services.deacon.automations.definitions import AutomationSettings, load_settings
from services.deacon.automations.runner import AutomationRunner
from services.deacon.effects import disk_watch, gc_kv
from services.deacon.effects.supervision import Supervision
from services.deacon.plan import disk, gc, hooks, liveness
from services.deacon.projection import new_projection
from services.deacon.state import DeaconState
from shared.aio import pause
from shared.commands import AutomationRun, Command, EscalationClose, EscalationRaise, SessionRecoverHook
from shared.config import TownConfig
from shared.decision import Accepted, DecideContext
from shared.errors import ActivityLostError
from shared.queries import Query, deacon
from shared.queries.deacon import DeaconStatus
from shared.service import Service, ServiceSettings

log = structlog.get_logger(__name__)
HOOK_MOVERS = ("witness", "refinery")
"""Services that move a bead on from its hook (sessions, merges); witnesses of a few rigs each count too."""


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
            store=self.store,
            clock=clock,
        )
        self.watch_errors = 0
        self.stale_hooks = 0
        self._hooks_handed_over: set[str] = set()
        """Stale-hook commands sent by this process (their ids also make a resend after a restart harmless)."""
        self.gc_checks = 0
        """Watch ticks that looked whether a sweep is owed (tests wait for "a few more" with it)."""
        self._gc_since: datetime | None = None
        self.kv_swept_seq = 0
        """The sweep whose KV purge this process carried out (a restart purges once more for the last one)."""
        self.kv_purged = gc_kv.Purged()
        """KV entries this process purged, in total."""
        self.disk_checks = 0
        self._disk_checked_at: float | None = None
        self._disk_unreadable = disk_watch.Unreadable()
        self.automations = AutomationRunner(
            config=config,
            settings=automations or load_settings(os.environ, config.gt_home),
            state=lambda: self.projection.state.automations,
            last_seq=lambda: self.projection.last_seq,
            append_owed=self.append_owed,
            store=self.store,
            clock=clock,
            wake=self.wake,
            holder=f"deacon-{self.instance}",
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

    def aggregate_key(self, cmd: Command) -> str | None:
        return deacon_decide.aggregate_key(cmd)

    async def prepare(self, cmd: Command) -> object:
        if isinstance(cmd, AutomationRun):
            return self.automations.lookup(cmd.name)  # the file as it reads now: deciding does no I/O
        return None

    def query(self, query: Query[Any]) -> Any:
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
            stale_hooks_handed_over=self.stale_hooks,
            gc_last_swept_at=state.gc.last_swept_at.isoformat() if state.gc.last_swept_at else None,
            gc_cutoff=state.gc.cutoff.isoformat() if state.gc.cutoff else None,
            gc_sweeps=state.gc.sweeps,
            gc_kv_purged=msgspec.structs.asdict(self.kv_purged),
            **self.automations.status(),
        )

    # ---- the watch ------------------------------------------------------------------------------

    def start_background(self, tg: asyncio.TaskGroup) -> None:
        assert self.nc is not None
        self.supervision.start(tg, self.nc)
        self.automations.start(tg, self.nc)
        tg.create_task(self._watch_loop(), name="deacon-watch")

    async def reconcile(self) -> None:
        await self.automations.reconcile()

    async def _watch_loop(self) -> None:
        while True:
            state = self.projection.state
            await self.wait_active()  # it marks leases expired in KV: never once another deacon acts
            try:
                await self.supervision.check_services(state.liveness)
                await self.supervision.expire_leases(state.leases)
                await self._hand_over_stale_hooks()
                await self._collect()
                await self._watch_disk()
            except ActivityLostError:
                raise
            except Exception:
                # A failed tick (NATS hiccup, a bug) is logged with its traceback; the next tick looks again.
                # Cancellation is not an Exception and passes.
                self.watch_errors += 1
                log.exception("deacon_watch_failed")
            await pause(self.watch.tick_s)

    async def _hand_over_stale_hooks(self) -> None:
        state = self.projection.state
        down = [name for service in HOOK_MOVERS for name in liveness.family_down(state.liveness, service)]
        if down:
            return  # a hook waiting on a service that is down is not stale: it moves once that one is back
        for hook in hooks.stale(state.hooks, state.leases, self.clock(), self.watch.stale_hook_after_s):
            if hook.command_id in self._hooks_handed_over:
                continue
            recover = SessionRecoverHook(bead=hook.bead, token=hook.token, actor="deacon", cmd_id=hook.command_id)
            await self.store(recover)
            self._hooks_handed_over.add(hook.command_id)
            self.stale_hooks += 1
            log.warning("stale_hook_handed_over", bead=hook.bead, token=hook.token, after=hook.holder)

    def disk_paths(self) -> tuple[str, ...]:
        """The paths whose volumes the disk alarm watches: ``GT_DISK_WATCH``, else what the town writes to here,
        each while it exists: GT_HOME (logs, run files, clones, worktrees; under compose the ``gt-home`` volume)
        and the JetStream store `gt up` keeps in it (``GT_HOME/nats/jetstream``: gt/supervisor.py). A store
        elsewhere (another machine, a container) is watched through the account's storage limit."""
        if self.watch.disk_paths is not None:
            return self.watch.disk_paths
        home = self.config.gt_home
        return tuple(str(path) for path in (home, home / "nats" / "jetstream") if path.is_dir())

    async def _watch_disk(self) -> None:
        """Raise the disk alarm while the log's storage runs low, close it once space is back (``disk.plan``)."""
        assert self.nc is not None
        now = time.monotonic()
        if self._disk_checked_at is not None and now - self._disk_checked_at < self.watch.disk_check_s:
            return
        self._disk_checked_at = now
        if self.watch.disk_low_percent <= 0:
            return
        seen = await disk_watch.measure(self.nc, self.disk_paths(), self._disk_unreadable)
        self.disk_checks += 1
        owed = disk.plan(self.projection.state.disk, seen, self.watch.disk_low_percent)
        if isinstance(owed, disk.RaiseAlarm):
            log.warning("disk_space_low", command_id=owed.command_id, message=owed.message)
            alarm = EscalationRaise(severity="high", message=owed.message, source=disk.SOURCE, cmd_id=owed.command_id)
            await self.store(alarm)
        elif isinstance(owed, disk.CloseAlarm):
            log.info("disk_space_back", escalation=owed.escalation, reason=owed.reason)
            await self.store(EscalationClose(id=owed.escalation, reason=owed.reason, cmd_id=owed.command_id))

    async def _collect(self) -> None:
        """Sweep when one is due (every ``GT_GC_INTERVAL``), then purge the KV entries of dead things once per
        recorded sweep, whoever appended it (this deacon, another one, or ``gt gc``)."""
        assert self.nc is not None
        self.gc_checks += 1
        now = self.clock()
        if self._gc_since is None:
            self._gc_since = now  # when this deacon began watching: a town that never swept waits an interval
        owed = gc.due(self.projection.state.gc, now, self.watch.gc_interval_s, self._gc_since)
        if owed and await self.append_owed([gc.sweep(self.projection.state.gc, now, self.watch.gc_ttl_s)]):
            log.info("gc_swept", ttl_s=self.watch.gc_ttl_s, seq=self.projection.state.gc.version)
        swept = self.projection.state.gc
        if swept.version > self.kv_swept_seq and swept.cutoff is not None:
            version = swept.version
            purged = await gc_kv.sweep_buckets(self.nc, self.config, self.projection.state, swept.cutoff)
            self.kv_purged.leases += purged.leases
            self.kv_purged.heartbeats += purged.heartbeats
            self.kv_purged.services += purged.services
            self.kv_swept_seq = version
