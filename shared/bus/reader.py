"""Reading the event log: replay from a sequence, know when caught up, then follow live on the same subscription.

The stream holds nothing but ``gt.evt.>``, so every sequence number belongs to us: the reader accepts only
``last + 1``, skips anything at or below ``last`` (duplicates after a consumer reset), and treats a jump as
a gap (nats-py's ordered consumer can drop messages silently when a callback is slow), resubscribing from
``last + 1``. A watchdog does the same when the stream is ahead of us and we make no progress.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any

import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext

from shared.errors import StreamGapError

log = structlog.get_logger(__name__)

ApplyFn = Callable[[int, str, bytes], None]
"""Called once per sequence, in order: (stream sequence, subject, data). Must be fast and must not raise."""


def parse_ack_reply(reply: str) -> tuple[int, int]:
    """(stream sequence, pending) from a JetStream delivery reply subject (v1 9 tokens, v2 12 tokens)."""
    tokens = reply.split(".")
    if len(tokens) == 9:  # noqa: PLR2004
        return int(tokens[5]), int(tokens[8])
    if len(tokens) >= 12:  # noqa: PLR2004
        return int(tokens[7]), int(tokens[10])
    raise ValueError(f"not a JetStream delivery reply: {reply!r}")


class EventReader:
    """Follows one stream from ``start_after + 1``, calling ``apply`` for each sequence exactly once, in order."""

    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        apply: ApplyFn,
        *,
        start_after: int = 0,
        subject: str = "gt.evt.>",
        idle_heartbeat: float = 2.0,
        watchdog_interval: float = 2.0,
        pending_msgs_limit: int | None = None,
    ) -> None:
        self._js = js
        self._stream = stream
        self._apply = apply
        self._subject = subject
        self._idle_heartbeat = idle_heartbeat
        self._watchdog_interval = watchdog_interval
        self._pending_msgs_limit = pending_msgs_limit
        self.last_seq = start_after
        self.pending = 0
        self.target_seq: int | None = None
        self.caught_up = asyncio.Event()
        self.resyncs = 0
        self.gaps = 0
        self._gap = asyncio.Event()
        self._generation = 0
        self._sub: Any = None
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._counter = itertools.count()

    # ---- waiting -------------------------------------------------------------------------------

    async def wait_for_seq(self, seq: int, timeout: float | None = None) -> None:
        """Return once every sequence up to ``seq`` has been applied."""
        if self.last_seq >= seq:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (seq, next(self._counter), fut))
        if timeout is None:
            await fut
        else:
            await asyncio.wait_for(fut, timeout)

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= self.last_seq:
            _, _, fut = heapq.heappop(waiters)
            if not fut.done():
                fut.set_result(None)

    # ---- delivery ------------------------------------------------------------------------------

    def _make_callback(self, generation: int) -> Callable[[Msg], Any]:
        async def on_msg(msg: Msg) -> None:
            if generation != self._generation:
                return
            seq, pending = parse_ack_reply(msg.reply)
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
            if not self.caught_up.is_set() and self.target_seq is not None and seq >= self.target_seq:
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
            except (nats.errors.Error, asyncio.TimeoutError) as exc:
                log.debug("unsubscribe_failed", error=repr(exc))

    async def _stream_last_seq(self) -> int:
        info = await self._js.stream_info(self._stream)
        return int(info.state.last_seq)

    async def run(self) -> None:
        """Subscribe and keep following until cancelled; resubscribe on gaps and stalls."""
        self.target_seq = await self._stream_last_seq()
        if self.last_seq >= self.target_seq:
            self.caught_up.set()
        await self._subscribe()
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
            try:
                await asyncio.wait_for(self._gap.wait(), timeout=self._watchdog_interval)
            except TimeoutError:
                pass
            if self._gap.is_set():
                await self._resync(StreamGapError(self.last_seq + 1, -1))
                progress_seq, progress_at = self.last_seq, time.monotonic()
                continue
            if self.last_seq != progress_seq:
                progress_seq, progress_at = self.last_seq, time.monotonic()
                continue
            # No progress for a while: if the stream is ahead of us, the subscription is stuck.
            if time.monotonic() - progress_at < self._watchdog_interval * 2:
                continue
            try:
                stream_last = await self._stream_last_seq()
            except (nats.errors.Error, asyncio.TimeoutError):
                continue  # server unreachable: the client reconnects, we check again next round
            if stream_last > self.last_seq:
                log.warning("reader_stalled", last_seq=self.last_seq, stream_last_seq=stream_last)
                await self._resync(None)
            progress_at = time.monotonic()

    async def _resync(self, reason: StreamGapError | None) -> None:
        self.resyncs += 1
        log.info("reader_resync", from_seq=self.last_seq + 1, reason="gap" if reason else "stall")
        await self._unsubscribe()
        self._gap.clear()
        while True:
            try:
                await self._subscribe()
                return
            except (nats.errors.Error, asyncio.TimeoutError) as exc:
                log.warning("resubscribe_failed", error=repr(exc))
                await asyncio.sleep(0.5)
