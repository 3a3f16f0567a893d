"""A service instance's heartbeat: its ``ServiceHeartbeat`` put in the ``GT_SERVICES`` bucket every interval.

A heartbeat is a cache of liveness (``shared.model.heartbeats``): the deacon turns what it sees into events. A missed
one is what liveness detection is for, so a failed put is logged and the next one tries again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from shared.bus.connection import Connection
from shared.bus.errors import BusError
from shared.bus.kv import Bucket
from shared.core.aio import pause
from shared.model import heartbeats
from shared.model.heartbeats import ServiceHeartbeat

log = structlog.get_logger(__name__)


class HeartbeatSender:
    """Puts what ``beat(stopping)`` says, every ``interval_s`` seconds, under the instance's key."""

    def __init__(self, bucket: str, interval_s: float, beat: Callable[[bool], ServiceHeartbeat]) -> None:
        self.bucket_name = bucket
        self.interval_s = interval_s
        self._beat = beat
        self._bucket: Bucket | None = None

    def connect(self, nc: Connection) -> None:
        self._bucket = Bucket(nc, self.bucket_name)

    async def run(self) -> None:
        while True:
            await self.put()
            await pause(self.interval_s)

    async def put(self, *, stopping: bool = False) -> None:
        """One heartbeat (``stopping``: the goodbye of a clean stop, so the deacon records it as stopped, not
        down)."""
        assert self._bucket is not None, "connect() first"
        beat = self._beat(stopping)
        try:
            async with asyncio.timeout(max(1.0, self.interval_s * 2)):
                await self._bucket.put(heartbeats.key_of(beat.service, beat.instance), heartbeats.encode(beat))
        except (BusError, TimeoutError) as exc:
            # A missed heartbeat is what liveness detection is for; the next one tries again.
            log.warning("heartbeat_failed", error=repr(exc))
