"""The snapshot keeper: a service's projection restored from its newest snapshot at start, stored again when due.

A snapshot is a cache (docs/architecture.md, "One service"): one whose schema does not match is passed over and the
log replayed instead; one that cannot be stored is tried again at the next check. One taken of another stream of the
log's name, or of more events than the log holds, says the town's log was lost: the service refuses to start
(``EventLogLostError``) rather than replay an empty or foreign log as if it were the town.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import structlog

from shared.bus.errors import BusError
from shared.bus.snapshots import SnapshotStore
from shared.bus.streams import StreamState
from shared.core.aio import raise_if_cancelling, wait_event
from shared.core.errors import EventLogLostError
from shared.service.projection import Projection

log = structlog.get_logger(__name__)

FINAL_SAVE_TIMEOUT_S = 10.0


class SnapshotKeeper:
    """Restores and stores one service's snapshot (its name is the key); ``run`` stores one whenever it is due."""

    def __init__(
        self,
        name: str,
        projection: Projection[Any],
        store: SnapshotStore,
        *,
        enabled: bool,
        every: int,
        check_interval: float,
    ) -> None:
        """``every``: store once this many events were applied since the last one (0: only at a clean stop);
        ``check_interval``: seconds between checks whether one is due."""
        self.name = name
        self.projection = projection
        self.enabled = enabled
        self.every = every
        self.check_interval = check_interval
        self._store = store
        self.seq = 0
        """The sequence the stored snapshot covers (the restored one's, at first)."""
        self.stream_id = ""
        """Which stream the log is (its creation time): a snapshot of another stream of the same name is not
        restored."""
        self._wanted = asyncio.Event()

    async def restore(self, log_state: StreamState, stream: str) -> None:
        """Load the newest snapshot into the projection, when there is one that fits ``log_state``."""
        created = log_state.created
        self.stream_id = created.isoformat() if created is not None else stream
        if self.enabled:
            started = time.monotonic()
            data = await self._store.load(self.name, starting=True)
            try:
                restored = data is not None and self.projection.restore(
                    data, stream_id=self.stream_id, stream_last_seq=log_state.last_seq
                )
            except EventLogLostError as exc:
                raise EventLogLostError(stream, exc.why) from None
            if restored and data is not None:
                log.info(
                    "snapshot_loaded",
                    last_seq=self.projection.last_seq,
                    bytes=len(data),
                    seconds=round(time.monotonic() - started, 3),
                )
        self.seq = self.projection.last_seq

    def applied(self) -> None:
        """Called after each applied event: the projection may want a snapshot now (after a GC sweep)."""
        if self.projection.snapshot_due:
            self._wanted.set()

    async def run(self) -> None:
        """Store a snapshot whenever one is due, until cancelled (run by the active instance only: a standby's
        would be the same fold)."""
        if not self.enabled or self.every <= 0:
            return
        while True:
            raise_if_cancelling()
            # Woken at once when the projection wants a snapshot now (a compacted state after a GC sweep).
            await wait_event(self._wanted, self.check_interval)
            self._wanted.clear()
            behind = self.projection.last_seq - self.seq
            if self.projection.snapshot_due or behind >= self.every:
                await self.save()

    async def save(self) -> int:
        """Store the projection as this service's snapshot (replacing the stored one); returns the sequence it
        covers (0: not stored)."""
        seq = self.projection.last_seq
        wanted, self.projection.snapshot_due = self.projection.snapshot_due, False
        data = self.projection.snapshot(self.stream_id)
        try:
            await self._store.save(self.name, data)
        except (TimeoutError, BusError) as exc:
            log.warning("snapshot_save_failed", error=repr(exc))
            self.projection.snapshot_due = self.projection.snapshot_due or wanted  # tried again at the next check
            return 0
        self.seq = seq
        log.info("snapshot_saved", last_seq=seq, bytes=len(data))
        return seq

    async def save_on_stop(self, *, connected: bool) -> None:
        """The last snapshot of a clean stop, when anything was applied since the stored one (bounded: a process
        on its way out must not hang on it)."""
        if not self.enabled or self.projection.last_seq <= self.seq or not connected:
            return
        with contextlib.suppress(BusError, TimeoutError):
            async with asyncio.timeout(FINAL_SAVE_TIMEOUT_S):
                await self.save()
