"""The held phase: a starting instance settles first the commands a dead predecessor held, and remembers which
one an instance died on while doing so.

JetStream hands a command an instance took and never acknowledged (it died holding it) to the next one only
after the ack wait, long after the commands stored behind it; so a new instance first settles what its
predecessor held, read from the stream in stream order, and only then fetches.

Read that way, a command carries no delivery count: a command the service *process* dies on (not an exception:
the process itself) would be read and settled again at every restart, before the consumer could ever deliver it
again and count it. So the held phase keeps a small record in the activity bucket (a
cache of no authority, like every KV value; one per service scope): written when the phase starts, removed
once every held command is settled. Finding it at start means the previous instance died during its held
phase: this one settles the held commands one at a time, naming in the record the one it is on, so the next
instance knows which command it died on and how often. One named that many times is set aside.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

import msgspec
import structlog

from shared.bus.errors import BusError
from shared.bus.kv import Bucket
from shared.core.aio import pause
from shared.core.decoding import UNDECODABLE
from shared.service.intake.delivery import Delivery

if TYPE_CHECKING:
    from shared.service.intake.consumer import CommandIntake

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


class HeldPhase:
    """What an intake does before it fetches: dispatch, in stream order, every command its consumer delivered and
    nobody acked yet."""

    def __init__(self, intake: CommandIntake, tracker: HeldAttempts | None) -> None:
        self._intake = intake
        self._tracker = tracker
        """The record of held phases (None: not kept, as in tests of the intake alone)."""

    async def run(self) -> None:
        """Fetches that follow queue behind the held commands per aggregate, so a later command never overtakes
        one a dead instance held. Settling one that is in fact still held by a live instance is harmless: its
        outcome is stored once."""
        intake, tracker = self._intake, self._tracker
        started = time.monotonic()
        span = await intake.consumer.unacked_span()
        record = await tracker.load() if tracker is not None else None
        if span is None:
            if tracker is not None and record is not None:
                await tracker.clear()
            return
        if tracker is not None:
            await tracker.save(record or HeldRecord())
        patterns, next_seq, last = span
        count = 0
        held: list[asyncio.Task[int]] = []
        while next_seq <= last:
            try:
                async with contextlib.aclosing(intake.consumer.stored_between(patterns, next_seq, last)) as stored:
                    async for msg in stored:
                        await intake.slots.acquire()
                        delivery = Delivery.held_by_predecessor(msg, intake.max_bytes, intake.origin_from)
                        if tracker is not None and record is not None:
                            task = await self._settle_carefully(delivery, tracker, record)
                        else:
                            task = intake.dispatch(delivery)
                        if task is not None:
                            held.append(task)
                        next_seq = delivery.stream_seq + 1
                        count += 1
                break
            except (TimeoutError, BusError) as exc:
                log.warning("held_commands_read_failed", consumer=intake.durable, at=next_seq, error=repr(exc))
                await pause(0.5)
        log.info("held_commands_dispatched", count=count, upto=last, seconds=round(time.monotonic() - started, 3))
        if tracker is not None:
            intake.keep(asyncio.create_task(_clear_once_settled(held, tracker), name="held-record"))

    async def _settle_carefully(
        self, delivery: Delivery, tracker: HeldAttempts, record: HeldRecord
    ) -> asyncio.Task[int] | None:
        """The previous instance died in its held phase: settle one held command at a time, the record naming
        it first, so that a command instances keep dying on is known, and set aside once named too often."""
        intake = self._intake
        if not intake.owns(delivery.subject) or await intake.settler.settled_before(delivery):
            return intake.dispatch(delivery)  # another's, or its outcome is stored: settling it cannot fail
        deaths = record.deaths.get(delivery.stream_seq, 0)
        if deaths >= intake.poison.max_failures:
            await intake.poison.escalate(delivery, None)
            why = f"{deaths} instances of the {intake.service} stopped while settling it"
            return intake.dispatch(delivery, override=intake.poison.set_aside_error(why))
        record.current = delivery.stream_seq
        await tracker.save(record)
        task = intake.dispatch(delivery)
        if task is not None:
            await asyncio.wait({task})
        record.current = None
        return task


async def _clear_once_settled(held: list[asyncio.Task[int]], tracker: HeldAttempts) -> None:
    """The held phase ended without this instance dying: the next start needs no care."""
    if held:
        await asyncio.wait(held)
    await tracker.clear()
