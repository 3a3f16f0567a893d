"""Replay the event log from a sequence, notice when caught up, then follow it live on the same subscription.

The reader rides nats-py's ordered push consumer (the fastest way to read a stream from Python) and does
not trust it blindly: GT_EVT holds only ``gt.evt.>``, so the sequences a whole-stream reader sees must be
contiguous. Anything below the next expected sequence is a repeat and is dropped; anything above it is a
gap (nats-py drops messages silently when a subscription's pending limits overflow) and makes the reader
resubscribe from the last sequence it applied. A watchdog resubscribes as well when the stream is ahead
and nothing has arrived for a while (a lost consumer after a server restart, say).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any

import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from shared.bus.connection import Connection
from shared.bus.errors import map_errors, retryable
from shared.core.aio import pause, raise_if_cancelling, wait_event
from shared.core.subjects import EVT_PREFIX, parse_js_reply

log = structlog.get_logger(__name__)

ApplyFn = Callable[[int, str, bytes], None]
"""Called once per sequence, in order: (stream sequence, subject, data). Must be fast and must not raise."""


class EventReader:
    """Follows one stream from ``start_after + 1``, calling ``apply`` for each sequence exactly once, in order."""

    def __init__(
        self,
        nc: Connection,
        stream: str,
        apply: ApplyFn,
        *,
        start_after: int = 0,
        subject: str = EVT_PREFIX + ".>",
        idle_heartbeat: float = 2.0,
        watchdog_interval: float = 2.0,
        pending_msgs_limit: int | None = None,
    ) -> None:
        self._js = nc.jetstream()
        self._stream = stream
        self._apply = apply
        self._subject = subject
        self._idle_heartbeat = idle_heartbeat
        self._watchdog_interval = watchdog_interval
        self._pending_msgs_limit = pending_msgs_limit
        self.last_seq = start_after
        """The last sequence handed to ``apply``."""
        self.pending = 0
        """Messages the server still had for this reader at the last delivery."""
        self.target_seq: int | None = None
        """The stream's last sequence when the reader started: reaching it means caught up."""
        self.caught_up = asyncio.Event()
        self.resyncs = 0
        self.gaps = 0
        self._gap = asyncio.Event()
        self._generation = 0
        self._sub: Any = None
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._counter = itertools.count()

    @property
    def stream(self) -> str:
        return self._stream

    # ---- waiting ------------------------------------------------------------------------------

    @map_errors
    async def wait_for_seq(self, seq: int, timeout: float | None = None) -> None:
        """Return once every sequence up to ``seq`` has been applied.

        Raises:
            TimeoutError: ``timeout`` passed first.
        """
        if self.last_seq >= seq:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (seq, next(self._counter), fut))
        async with asyncio.timeout(timeout):
            await fut

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= self.last_seq:
            _, _, fut = heapq.heappop(waiters)
            if not fut.done():
                fut.set_result(None)

    # ---- delivery -----------------------------------------------------------------------------

    def _make_callback(self, generation: int) -> Callable[[Msg], Any]:
        async def on_msg(msg: Msg) -> None:
            if generation != self._generation:
                return  # a message still queued for a subscription we have replaced
            seq, _delivered, pending = parse_js_reply(msg.reply)
            expected = self.last_seq + 1
            if seq < expected:
                return  # already applied (consumer reset or redelivery)
            if seq > expected:
                if not self._gap.is_set():
                    self.gaps += 1
                    log.warning("stream_gap", expected=expected, got=seq)
                    self._gap.set()
                return
            self._apply(seq, msg.subject, msg.data)
            self.last_seq = seq
            self.pending = pending
            if self._waiters:
                self._wake()
            if self.target_seq is not None and seq >= self.target_seq and not self.caught_up.is_set():
                self.caught_up.set()

        return on_msg

    async def _subscribe(self) -> None:
        self._generation += 1
        kwargs: dict[str, Any] = {}
        if self._pending_msgs_limit is not None:
            kwargs["pending_msgs_limit"] = self._pending_msgs_limit
        self._sub = await self._js.subscribe(
            self._subject,
            stream=self._stream,
            cb=self._make_callback(self._generation),
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.last_seq + 1),
            idle_heartbeat=self._idle_heartbeat,
            **kwargs,
        )

    async def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        self._generation += 1
        if sub is not None:
            try:
                await sub.unsubscribe()
            except (TimeoutError, nats.errors.Error) as exc:
                log.debug("unsubscribe_failed", error=repr(exc))

    @map_errors
    async def stream_last_seq(self) -> int:
        """The stream's last sequence, asked of the server (retried while it is unreachable)."""
        while True:
            raise_if_cancelling()
            try:
                info = await self._js.stream_info(self._stream)
            except (TimeoutError, nats.errors.Error) as exc:
                if not retryable(exc):
                    raise
                log.warning("stream_info_failed", stream=self._stream, error=repr(exc))
                await pause(0.5)
                continue
            return int(info.state.last_seq)

    @map_errors
    async def run(self) -> None:
        """Subscribe and keep following until cancelled; resubscribe on gaps and stalls."""
        self.target_seq = await self.stream_last_seq()
        if self.last_seq >= self.target_seq:
            self.caught_up.set()
        await self._resubscribe()
        try:
            await self._supervise()
        finally:
            await self._unsubscribe()
            for _, _, fut in self._waiters:
                if not fut.done():
                    fut.cancel()

    async def _supervise(self) -> None:
        progress_seq = self.last_seq
        progress_at = time.monotonic()
        while True:
            raise_if_cancelling()
            await wait_event(self._gap, self._watchdog_interval)
            if self._gap.is_set():
                log.info("reader_resync", from_seq=self.last_seq + 1, reason="gap")
                await self._resubscribe()
                progress_seq, progress_at = self.last_seq, time.monotonic()
                continue
            if self.last_seq != progress_seq:
                progress_seq, progress_at = self.last_seq, time.monotonic()
                continue
            if self.pending > 0:
                # The last message said more were coming and none came: they were dropped at the tail of
                # a burst (no later message reveals such a gap) or the subscription died mid-replay.
                log.warning("reader_stalled", last_seq=self.last_seq, pending=self.pending)
                await self._resubscribe()
                progress_at = time.monotonic()
                continue
            if time.monotonic() - progress_at < self._watchdog_interval * 2:
                continue
            # Idle for a while: if the stream is ahead of us anyway, the subscription is stuck.
            try:
                info = await self._js.stream_info(self._stream)
            except (TimeoutError, nats.errors.Error) as exc:
                if not retryable(exc):
                    raise
                continue  # server unreachable: the client reconnects, we check again next round
            if int(info.state.last_seq) > self.last_seq:
                log.warning("reader_stalled", last_seq=self.last_seq, stream_last_seq=int(info.state.last_seq))
                await self._resubscribe()
            progress_at = time.monotonic()

    async def _resubscribe(self) -> None:
        if self._sub is not None:
            self.resyncs += 1
        await self._unsubscribe()
        self._gap.clear()
        while True:
            raise_if_cancelling()
            try:
                await self._subscribe()
            except (TimeoutError, nats.errors.Error) as exc:
                if not retryable(exc):
                    raise
                log.warning("subscribe_failed", error=repr(exc))
                await pause(0.5)
                continue
            return
