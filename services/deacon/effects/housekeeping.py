"""The deacon's watch, one pass per tick (``DeaconService.tick``, every ``GT_DEACON_TICK``): record services up
and down and expire lapsed leases (``supervision``), hand stale hooks to the witness, sweep when a sweep is due
and purge the KV entries of dead things, and raise or close the disk alarm. What each step owes is decided by
the pure ``plan`` modules; this adapter stores it (events through ``append_owed``, commands through ``store``).

It runs on its own tick, independent of the patrol, so a dead service or an expired lease is noticed within a
tick. It reads its settings through a getter: a test may change them on a running deacon."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

import structlog

from services.deacon.effects import disk_watch, gc_kv
from services.deacon.effects.supervision import AppendOwed, Supervision
from services.deacon.plan import disk, gc, hooks
from services.deacon.settings import DeaconSettings
from services.deacon.state import DeaconState
from shared.bus.commands import StoreCommand
from shared.bus.connection import Connection
from shared.core.config import TownConfig
from shared.model.commands import EscalationClose, EscalationRaise, SessionRecoverHook

log = structlog.get_logger(__name__)


class Housekeeping:
    def __init__(
        self,
        *,
        config: TownConfig,
        settings: Callable[[], DeaconSettings],
        state: Callable[[], DeaconState],
        supervision: Supervision,
        append_owed: AppendOwed,
        store: StoreCommand,
        clock: Callable[[], datetime],
    ) -> None:
        self._config = config
        self._settings = settings
        self._state = state
        self.supervision = supervision
        self._append_owed = append_owed
        self._store = store
        self._clock = clock
        self._nc: Connection | None = None
        self.stale_hooks = 0
        self._hooks_handed_over: set[str] = set()
        """Stale-hook commands sent by this process (their ids also make a resend after a restart harmless)."""
        self.gc_checks = 0
        """Ticks that looked whether a sweep is owed (tests wait for "a few more" with it)."""
        self._gc_since: datetime | None = None
        self.kv_swept_seq = 0
        """The sweep whose KV purge this process carried out (a restart purges once more for the last one)."""
        self.kv_purged = gc_kv.Purged()
        """KV entries this process purged, in total."""
        self.disk_checks = 0
        self._disk_checked_at: float | None = None
        self._disk_unreadable = disk_watch.Unreadable()

    def start(self, nc: Connection) -> None:
        self._nc = nc

    async def tick(self) -> None:
        state = self._state()
        await self.supervision.check_services(state.liveness)
        await self.supervision.expire_leases(state.leases)
        await self._hand_over_stale_hooks()
        await self._collect()
        await self._watch_disk()

    async def _hand_over_stale_hooks(self) -> None:
        state = self._state()
        after_s = self._settings().stale_hook_after_s
        for hook in hooks.to_hand_over(state.hooks, state.leases, state.liveness, self._clock(), after_s):
            if hook.command_id in self._hooks_handed_over:
                continue
            recover = SessionRecoverHook(bead=hook.bead, token=hook.token, actor="deacon", cmd_id=hook.command_id)
            await self._store(recover)
            self._hooks_handed_over.add(hook.command_id)
            self.stale_hooks += 1
            log.warning("stale_hook_handed_over", bead=hook.bead, token=hook.token, after=hook.holder)

    def disk_paths(self) -> tuple[str, ...]:
        """The paths whose volumes the disk alarm watches: ``GT_DISK_WATCH``, else what the town writes to here,
        each while it exists: GT_HOME (logs, run files, clones, worktrees; under compose the ``gt-home`` volume)
        and the JetStream store `gt up` keeps in it (``GT_HOME/nats/jetstream``: gt/town/supervisor.py). A store
        elsewhere (another machine, a container) is watched through the account's storage limit."""
        chosen = self._settings().disk_paths
        if chosen is not None:
            return chosen
        home = self._config.gt_home
        return tuple(str(path) for path in (home, home / "nats" / "jetstream") if path.is_dir())

    async def _watch_disk(self) -> None:
        """Raise the disk alarm while the log's storage runs low, close it once space is back (``disk.plan``)."""
        assert self._nc is not None
        settings = self._settings()
        now = time.monotonic()
        if self._disk_checked_at is not None and now - self._disk_checked_at < settings.disk_check_s:
            return
        self._disk_checked_at = now
        if settings.disk_low_percent <= 0:
            return
        seen = await disk_watch.measure(self._nc, self.disk_paths(), self._disk_unreadable)
        self.disk_checks += 1
        owed = disk.plan(self._state().disk, seen, settings.disk_low_percent)
        if isinstance(owed, disk.RaiseAlarm):
            log.warning("disk_space_low", command_id=owed.command_id, message=owed.message)
            alarm = EscalationRaise(severity="high", message=owed.message, source=disk.SOURCE, cmd_id=owed.command_id)
            await self._store(alarm)
        elif isinstance(owed, disk.CloseAlarm):
            log.info("disk_space_back", escalation=owed.escalation, reason=owed.reason)
            await self._store(EscalationClose(id=owed.escalation, reason=owed.reason, cmd_id=owed.command_id))

    async def _collect(self) -> None:
        """Sweep when one is due (every ``GT_GC_INTERVAL``), then purge the KV entries of dead things once per
        recorded sweep, whoever appended it (this deacon, another one, or ``gt gc``)."""
        assert self._nc is not None
        settings = self._settings()
        self.gc_checks += 1
        now = self._clock()
        if self._gc_since is None:
            self._gc_since = now  # when this deacon began watching: a town that never swept waits an interval
        owed = gc.due(self._state().gc, now, settings.gc_interval_s, self._gc_since)
        if owed and await self._append_owed([gc.sweep(self._state().gc, now, settings.gc_ttl_s)]):
            log.info("gc_swept", ttl_s=settings.gc_ttl_s, seq=self._state().gc.version)
        swept = self._state().gc
        if swept.version > self.kv_swept_seq and swept.cutoff is not None:
            version = swept.version
            purged = await gc_kv.sweep_buckets(self._nc, self._config, self._state(), swept.cutoff)
            self.kv_purged.leases += purged.leases
            self.kv_purged.heartbeats += purged.heartbeats
            self.kv_purged.services += purged.services
            self.kv_swept_seq = version
