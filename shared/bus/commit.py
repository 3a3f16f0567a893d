"""Group commit: many independent appends stored as one atomic batch.

Each JetStream write with ``sync_interval: always`` costs an fsync; an atomic batch pays one fsync for up
to 1000 messages. The committer queues appends from concurrent tasks (one per command, say) and writes
whatever has queued as one batch while the previous batch is being stored, so throughput grows with load
and a lone append still goes out at once.

A batch is all-or-nothing, so one conflicting append would fail its neighbours: on a conflict the group is
split in halves and each half is committed again, until the conflicting append stands alone and gets
its own ``AppendConflictError``. The cost is a few extra batches for a rare event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence

import structlog

from shared.bus.append import MAX_BATCH_MESSAGES, Appender, PendingEvent
from shared.bus.errors import map_errors
from shared.core.aio import raise_if_cancelling
from shared.core.errors import AppendConflictError, AppendFailedError, BusError, GastownError

log = structlog.get_logger(__name__)

DEFAULT_MAX_GROUP_BYTES = 4 * 1024 * 1024


class _Append:
    __slots__ = ("events", "future", "size")

    def __init__(self, events: Sequence[PendingEvent], future: asyncio.Future[list[int]]) -> None:
        self.events = events
        self.future = future
        self.size = sum(len(ev.data) for ev in events)


class GroupCommitter:
    """Queues appends and stores them in atomic groups. ``run()`` must be running for appends to complete."""

    def __init__(
        self,
        appender: Appender,
        *,
        max_messages: int = MAX_BATCH_MESSAGES,
        max_bytes: int = DEFAULT_MAX_GROUP_BYTES,
    ) -> None:
        self._appender = appender
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._queue: deque[_Append] = deque()
        self._wakeup = asyncio.Event()
        self.groups = 0
        self.splits = 0

    @map_errors
    async def append(self, events: Sequence[PendingEvent]) -> list[int]:
        """Store ``events`` atomically (within a larger group) and return their stream sequences.

        Raises the same errors as ``Appender.append`` for these events alone.
        """
        if not events:
            return []
        if len(events) > self._max_messages:
            raise ValueError(f"{len(events)} events in one append; the limit is {self._max_messages}")
        if events[-1].expected_seq is None:
            # Any append may end up last in its group, where its concurrency check is what makes a
            # resent group recognisable.
            raise ValueError("the last event of a grouped append must carry an expected sequence")
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Append(events, future))
        self._wakeup.set()
        return await future

    @map_errors
    async def run(self) -> None:
        """Write queued appends until cancelled; fails queued appends with the cancellation."""
        try:
            while True:
                raise_if_cancelling()
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._queue:
                    group = self._take_group()
                    await self._commit(group)
        finally:
            pending, self._queue = self._queue, deque()
            for item in pending:
                if not item.future.done():
                    item.future.cancel()

    def _take_group(self) -> list[_Append]:
        group: list[_Append] = []
        messages = size = 0
        while self._queue:
            item = self._queue[0]
            if group and (messages + len(item.events) > self._max_messages or size + item.size > self._max_bytes):
                break
            group.append(self._queue.popleft())
            messages += len(item.events)
            size += item.size
        return group

    async def _commit(self, group: list[_Append]) -> None:
        self.groups += 1
        events = [ev for item in group for ev in item.events]
        try:
            seqs = await self._appender.append(events)
        except (AppendConflictError, AppendFailedError) as exc:
            if len(group) == 1:
                _fail(group[0], exc)
                return
            # Someone in the group conflicts (or is refused): find them by halving.
            self.splits += 1
            mid = len(group) // 2
            await self._commit(group[:mid])
            await self._commit(group[mid:])
            return
        except (GastownError, ValueError) as exc:
            if isinstance(exc, BusError):
                # NATS itself failed (not the appender's verdict on these events): worth its traceback.
                log.exception("group_commit_failed", appends=len(group))
            for item in group:
                _fail(item, exc)
            return
        except asyncio.CancelledError:
            for item in group:
                if not item.future.done():
                    item.future.cancel()
            raise
        except Exception as exc:
            log.exception("group_commit_failed", appends=len(group))
            for item in group:
                _fail(item, exc)
            return
        offset = 0
        for item in group:
            n = len(item.events)
            if not item.future.done():
                item.future.set_result(seqs[offset : offset + n])
            offset += n


def _fail(item: _Append, exc: BaseException) -> None:
    if not item.future.done():
        item.future.set_exception(exc)
        # The waiter may have been cancelled meanwhile; make sure the exception is marked retrieved.
        with contextlib.suppress(BaseException):
            item.future.exception()
