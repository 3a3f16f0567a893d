"""Which command a service instance died on while it settled the commands its predecessor held.

A starting instance settles first the commands a dead predecessor held, read from the stream (see
``shared.intake``). Read that way, a command carries no delivery count: a command the service *process* dies on
(not an exception: the process itself) would be read and settled again at every restart, before the consumer
could ever deliver it again and count it. So the held phase keeps a small record in the activity bucket (a
cache of no authority, like every KV value; one per service scope): written when the phase starts, removed
once every held command is settled. Finding it at start means the previous instance died during its held
phase: this one settles the held commands one at a time, naming in the record the one it is on, so the next
instance knows which command it died on and how often. One named that many times is set aside.
"""

from __future__ import annotations

import contextlib

import msgspec
import structlog

from shared.bus.errors import BusError
from shared.bus.kv import Bucket
from shared.decoding import UNDECODABLE

log = structlog.get_logger(__name__)


class HeldRecord(msgspec.Struct, kw_only=True):
    current: int | None = None
    """The stream sequence of the held command being settled (one at a time) when the record was written."""
    deaths: dict[int, int] = {}
    """Stream sequence -> instances that died settling it."""


class HeldAttempts:
    """The record of one scope's held phases in KV; every failure to reach KV only costs precision."""

    def __init__(self, bucket: Bucket, key: str) -> None:
        self._bucket = bucket
        self._key = key
        self._opened = False
        """The bucket answered at ``load``: the record is written and cleared there (else never)."""
        self.record: HeldRecord | None = None
        """What the previous instance left (None: its held phase ended, or there was none)."""

    async def load(self) -> HeldRecord | None:
        """The record left by an instance that died in its held phase, the command it was on counted."""
        try:
            await self._bucket.open()
            self._opened = True
            entry = await self._bucket.get(self._key)
        except (TimeoutError, BusError) as exc:
            log.warning("held_record_unreadable", key=self._key, error=repr(exc))
            return None
        if entry is None:
            return None
        try:
            record = msgspec.json.decode(entry.value, type=HeldRecord)
        except UNDECODABLE:
            return HeldRecord()
        if record.current is not None:
            record.deaths[record.current] = record.deaths.get(record.current, 0) + 1
            record.current = None
        self.record = record
        return record

    async def save(self, record: HeldRecord) -> None:
        if not self._opened:
            return
        try:
            await self._bucket.put(self._key, msgspec.json.encode(record))
        except (TimeoutError, BusError) as exc:
            log.warning("held_record_unsaved", key=self._key, error=repr(exc))

    async def clear(self) -> None:
        if not self._opened:
            return
        with contextlib.suppress(TimeoutError, BusError):
            await self._bucket.delete(self._key)
