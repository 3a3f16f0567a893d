"""Following the log by batched direct gets of one subject filter: what a client with no JetStream consumer of its own
can do. The gate runners (account RUNNERS, ops/nats/accounts.conf) read the log so: a consumer's deliver subject, like
any reply subject a client of account GT sets, is a trampoline (JetStream publishes there with its own rights), and
their account has no JetStream to turn against the town.

``DirectReader`` is ``reader.EventReader``'s stand-in (the same ``Follower`` surface): it hands ``apply`` only the
messages on its filter, in order, each once, and tells ``passed`` how far the stream was read besides, so that
``last_seq`` (and whoever waits on it: read-your-writes, an append waiting to be applied) stands at the stream's end
even when nothing there was on the filter. Each round reads the stream's last sequence first (the stream's leader
answers), then the filter's messages after ``last_seq`` by batched direct gets until the answering server says none
is pending. Any replica answers a direct get, and one may lag the leader: so before ``last_seq`` moves past what was
read, the leader is asked for the next message on the filter (a message get, which only the leader answers); none
means every message on the filter up to that last sequence has been applied, and ``last_seq`` moves there. One it
has is applied, and the round goes on. A round that lost a message on the way (a batch cut at a hole, ``log_read``)
moves only as far as what arrived, and the next round reads the rest.

It polls: at once while messages come, then after ``poll_s``, doubling up to ``max_poll_s`` while none do, and at
once when someone waits for a sequence it has not read (``wait_for_seq``).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

import nats.errors
import nats.js.errors
import structlog

from shared.bus import log_read
from shared.bus.connection import Connection
from shared.bus.errors import map_errors, retryable
from shared.bus.reader import ApplyFn
from shared.bus.streams import Stored
from shared.core.aio import pause, raise_if_cancelling, wait_event

log = structlog.get_logger(__name__)

BATCH = 512
MAX_BATCH_BYTES = 1 << 20
EMPTY_CUTS = 3
"""Batches in a row that brought nothing though the server said more were pending (their first message lost on the
way) before the round ends and the next one tries again."""


class DirectReader:
    """Follows ``stream``'s messages on ``subject`` from ``start_after + 1``, calling ``apply`` for each once, in order,
    and ``passed`` with each stream sequence read up to (see the module's docstring)."""

    def __init__(
        self,
        nc: Connection,
        stream: str,
        apply: ApplyFn,
        *,
        subject: str,
        passed: Callable[[int], None],
        start_after: int = 0,
        poll_s: float = 0.05,
        max_poll_s: float = 0.5,
    ) -> None:
        self._nc = nc
        self._stream = stream
        self._apply = apply
        self._subject = subject
        self._passed = passed
        self._poll_s = poll_s
        self._max_poll_s = max_poll_s
        self.last_seq = start_after
        """The stream sequence read up to: every message on the filter up to it was handed to ``apply``."""
        self.pending = 0
        """Messages on the filter the server still had after the last batch."""
        self.target_seq: int | None = None
        """The stream's last sequence when the reader started: reaching it means caught up."""
        self.caught_up = asyncio.Event()
        self.resyncs = 0
        """Rounds that ended before the server's end (a message lost on the way); read again."""
        self.gaps = 0
        self.lagging = 0
        """Messages the leader had that the replica answering a batch did not have yet."""
        self._poke = asyncio.Event()
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._counter = itertools.count()

    @property
    def stream(self) -> str:
        return self._stream

    @map_errors
    async def wait_for_seq(self, seq: int, timeout: float | None = None) -> None:
        """Return once the stream was read up to ``seq`` (read at once, not at the next poll).

        Raises:
            TimeoutError: ``timeout`` passed first.
        """
        if self.last_seq >= seq:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (seq, next(self._counter), fut))
        self._poke.set()
        async with asyncio.timeout(timeout):
            await fut

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= self.last_seq:
            _, _, fut = heapq.heappop(waiters)
            if not fut.done():
                fut.set_result(None)

    @map_errors
    async def stream_last_seq(self) -> int:
        """The stream's last sequence, asked of the server (retried while it is unreachable)."""
        while True:
            raise_if_cancelling()
            try:
                return await self._stream_last_seq()
            except (TimeoutError, nats.errors.Error) as exc:
                if not retryable(exc):
                    raise
                log.warning("stream_info_failed", stream=self._stream, error=repr(exc))
                await pause(0.5)

    async def _next_on_leader(self) -> Stored | None:
        """The stream leader's first message on the filter after ``last_seq``; None when it has none."""
        try:
            msg = await self._nc.jetstream().get_msg(
                self._stream, seq=self.last_seq + 1, subject=self._subject, next=True
            )
        except nats.js.errors.NotFoundError:
            return None
        assert msg.seq is not None
        return Stored(int(msg.seq), str(msg.subject or ""), msg.data or b"")

    async def _stream_last_seq(self) -> int:
        info = await self._nc.jetstream().stream_info(self._stream)
        return int(info.state.last_seq)

    @map_errors
    async def run(self) -> None:
        """Read round after round until cancelled."""
        self.target_seq = await self.stream_last_seq()
        idle = self._poll_s
        try:
            while True:
                raise_if_cancelling()
                self._poke.clear()
                try:
                    moved = await self._round()
                except Exception as exc:
                    if not retryable(exc):
                        raise
                    log.warning("direct_read_failed", stream=self._stream, error=repr(exc))
                    await pause(0.5)
                    continue
                if self.target_seq is not None and self.last_seq >= self.target_seq and not self.caught_up.is_set():
                    self.caught_up.set()
                if moved:
                    idle = self._poll_s
                    continue
                await wait_event(self._poke, idle)
                idle = min(idle * 2, self._max_poll_s)
        finally:
            for _, _, fut in self._waiters:
                if not fut.done():
                    fut.cancel()

    async def _round(self) -> bool:
        """One read of everything stored now; whether ``last_seq`` moved."""
        end = await self._stream_last_seq()
        before = self.last_seq
        empty_cuts = 0
        while True:
            batch = await log_read.read_batch(
                self._nc, self._stream, self.last_seq + 1, BATCH, MAX_BATCH_BYTES, subject=self._subject
            )
            for stored in batch.messages:
                self._apply(stored.seq, stored.subject, stored.data)
                self.last_seq = stored.seq
            self.pending = batch.pending
            if self._waiters:
                self._wake()
            if batch.pending == 0:
                found = await self._next_on_leader()
                if found is None:
                    break
                # The replica that answered is behind the leader: the leader's next one, then read on from there.
                self._apply(found.seq, found.subject, found.data)
                self.last_seq = found.seq
                self.lagging += 1
                continue
            if batch.messages:
                empty_cuts = 0
                continue
            empty_cuts += 1
            if empty_cuts >= EMPTY_CUTS:
                # The server keeps saying more are pending and none arrive: read again next round, from here.
                self.resyncs += 1
                log.warning("direct_read_cut", stream=self._stream, after=self.last_seq, pending=batch.pending)
                return self.last_seq != before
        if end > self.last_seq:
            # Everything on the filter up to ``end`` was read (the server answered after ``end`` was asked for).
            self._passed(end)
            self.last_seq = end
            if self._waiters:
                self._wake()
        return self.last_seq != before
