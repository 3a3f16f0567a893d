"""Durable consumers: a service's command consumer on GT_CMD (``CommandConsumer``), and what is done with what it
delivers (``ack``, ``nak``). (Plugins read GT_EVT by direct gets, ``log_read``: they have no consumer.)

A ``Message`` is a delivery as NATS made it: its ``subject``, ``data``, ``headers`` and ``reply`` are plain values;
everything that talks to the server about it goes through this module. A lost acknowledgement is never raised:
it only means one more delivery.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncGenerator
from datetime import datetime
from typing import Any, NamedTuple, TypeAlias

import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from shared.bus.connection import Connection
from shared.bus.errors import map_errors
from shared.core import subjects
from shared.core.aio import pause, raise_if_cancelling

log = structlog.get_logger(__name__)

Message: TypeAlias = Msg
"""One delivery of a stored message."""

FETCH_WAIT_S = 1.0
"""How long a fetch waits for the first command (then it is asked again)."""
DRAIN_WAIT_S = 0.01
"""How long a fetch of the commands already waiting behind one just fetched may wait for them."""
HELD_READ_BATCH = 1_024
HELD_READ_WAIT_S = 1.0
HELD_READER_INACTIVE_S = 30.0
"""The server removes the reader of held commands by itself this long after an instance died reading."""


class Stored(NamedTuple):
    """Where a message read from the stream (not delivered by a durable consumer) stands in it."""

    seq: int
    stored_at: datetime
    pending: int
    """Messages on the reader's subjects after this one."""


def stored(msg: Message) -> Stored:
    meta = msg.metadata
    return Stored(int(meta.sequence.stream), meta.timestamp, int(meta.num_pending))


def stored_at(msg: Message) -> datetime:
    """When the server stored it (its clock)."""
    return msg.metadata.timestamp


@map_errors
async def ack(msg: Message) -> None:
    # A lost ack only means the message is delivered again.
    with contextlib.suppress(nats.errors.Error, TimeoutError):
        await msg.ack()


@map_errors
async def nak(msg: Message, delay: float | None = None) -> None:
    # A lost nak only means the message comes back after the ack wait instead.
    with contextlib.suppress(nats.errors.Error, TimeoutError):
        await msg.nak(delay=delay)


class CommandConsumer:
    """A service's durable pull consumer on the command stream, and the commands it delivered that nobody
    acknowledged (a dead predecessor's), read from the stream in order."""

    def __init__(self, nc: Connection, stream: str, durable: str) -> None:
        self._js = nc.jetstream()
        self.stream = stream
        self.durable = durable
        self._sub: Any = None

    @map_errors
    async def bind(self) -> None:
        """Bind to the consumer, trying again until it is there and the server answers."""
        while True:
            raise_if_cancelling()
            try:
                self._sub = await self._js.pull_subscribe_bind(self.durable, self.stream)
            except (TimeoutError, nats.errors.Error) as exc:
                log.warning("command_consumer_bind_failed", consumer=self.durable, error=repr(exc))
                await pause(0.5)
            else:
                return

    @map_errors
    async def fetch(self, n: int, *, wait_s: float = FETCH_WAIT_S) -> list[Message]:
        """Up to ``n`` commands, waiting up to ``wait_s`` for them; [] when none came or the server failed (an
        unacknowledged command is delivered again after its ack wait). A fetch of many holds the first command
        it got until ``n`` came or ``wait_s`` passed (nats-py's pull), so an idle reader fetches one and then
        drains (``DRAIN_WAIT_S``)."""
        assert self._sub is not None, "bind() first"
        try:
            msgs: list[Msg] = await self._sub.fetch(n, timeout=wait_s)
        except (TimeoutError, nats.errors.TimeoutError):
            return []
        except nats.errors.Error as exc:
            # Server restarting or the consumer's leader moving: back off and fetch again.
            log.warning("command_fetch_failed", error=repr(exc))
            await pause(0.25)
            return []
        return msgs

    @map_errors
    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await self._sub.unsubscribe()

    @map_errors
    async def unacked_span(self) -> tuple[list[str], int, int] | None:
        """The consumer's subjects and the stream sequences between its ack floor and its last delivery, or None
        when it holds nothing unacknowledged; asked again until the server answers."""
        while True:
            raise_if_cancelling()
            try:
                info = await self._js.consumer_info(self.stream, self.durable)
            except (TimeoutError, nats.errors.Error) as exc:
                log.warning("held_commands_read_failed", consumer=self.durable, error=repr(exc))
                await pause(0.5)
                continue
            if not info.num_ack_pending or info.delivered is None:
                return None
            first = (info.ack_floor.stream_seq or 0) + 1 if info.ack_floor is not None else 1
            patterns = info.config.filter_subjects or [info.config.filter_subject or f"{subjects.CMD_PREFIX}.>"]
            return patterns, first, info.delivered.stream_seq or 0

    @map_errors
    async def stored_between(self, patterns: list[str], first: int, last: int) -> AsyncGenerator[Message]:
        """The commands on ``patterns`` still stored with sequences first..last (acked ones are gone), in stream
        order. A throwaway consumer streams them in batches: one request each would take seconds for the
        thousands a busy instance holds. It acks nothing and only adds interest while it lives, so the durable
        consumer's commands stay stored.

        Raises:
            BusError, TimeoutError: reading failed; start again after the last one handed out.
        """
        name = f"{self.durable}-held-{uuid.uuid4().hex[:8]}"
        await self._js.add_consumer(
            self.stream,
            ConsumerConfig(
                name=name,
                filter_subject=patterns[0] if len(patterns) == 1 else None,
                filter_subjects=patterns if len(patterns) > 1 else None,
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=first,
                ack_policy=AckPolicy.NONE,
                inactive_threshold=HELD_READER_INACTIVE_S,
                # Replicas left to the stream's: an interest stream refuses a consumer with fewer.
            ),
        )
        sub = None
        try:
            sub = await self._js.pull_subscribe_bind(name, self.stream)
            while True:
                try:
                    msgs: list[Msg] = await sub.fetch(HELD_READ_BATCH, timeout=HELD_READ_WAIT_S)
                except (TimeoutError, nats.errors.TimeoutError):
                    return  # nothing more is stored on these subjects
                for msg in msgs:
                    meta = msg.metadata
                    if meta.sequence.stream > last:
                        return
                    yield msg
                    if meta.num_pending == 0:
                        return
        finally:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                if sub is not None:
                    await sub.unsubscribe()  # its inbox would stay subscribed for the life of the connection
                await self._js.delete_consumer(self.stream, name)
