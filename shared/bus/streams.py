"""Reading a stream other than by following it whole (``reader.EventReader`` does that): its state, one subject's
messages, the first message after a time, the account's storage, the consumers' positions.

Every function takes the connection and a stream's name; a message that is not there is None, a failure of NATS
raises ``BusError`` or ``TimeoutError``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, NamedTuple

import nats.errors
import nats.js.errors
import structlog
from nats.js.api import ConsumerConfig, DeliverPolicy

from shared.bus.connection import Connection
from shared.bus.errors import map_errors, retryable
from shared.core.aio import pause, raise_if_cancelling
from shared.core.subjects import EVT_PREFIX, parse_js_reply

log = structlog.get_logger(__name__)

FIRST_AFTER_TIME_WAIT_S = 30.0


class StreamState(NamedTuple):
    last_seq: int
    created: datetime | None
    """When the stream was created: tells a stream from another of the same name (a snapshot is of one)."""
    metadata: dict[str, str]
    """The stream's configured metadata (``topology.ORIGIN_CUTOVER_KEY``)."""


class Stored(NamedTuple):
    """One stored message."""

    seq: int
    subject: str
    data: bytes


class Storage(NamedTuple):
    """The account's JetStream storage."""

    used: int
    limit: int
    """Bytes the account may store; 0 or less: no limit."""


@map_errors
async def state(nc: Connection, stream: str) -> StreamState:
    info = await nc.jetstream().stream_info(stream)
    return StreamState(
        last_seq=int(info.state.last_seq),
        created=getattr(info, "created", None),
        metadata=dict(info.config.metadata or {}),
    )


@map_errors
async def exists(nc: Connection, stream: str, *, timeout: float = 5.0) -> bool:
    """Whether JetStream has ``stream``; raises what asking raises when it cannot say (an election, a timeout)."""
    try:
        await nc.jetstream(timeout=timeout).stream_info(stream)
    except nats.js.errors.NotFoundError:
        return False
    return True


@map_errors
async def last_seq(nc: Connection, stream: str) -> int:
    """The stream's last sequence."""
    return int((await nc.jetstream().stream_info(stream)).state.last_seq)


@map_errors
async def state_when_ready(nc: Connection, stream: str, *, what: str = "stream_info_retry") -> StreamState:
    """The stream's state, asked again (logged as ``what``) while JetStream is briefly unavailable."""
    while True:
        raise_if_cancelling()
        try:
            return await state(nc, stream)
        except Exception as exc:
            if not retryable(exc):
                raise
            log.warning(what, stream=stream, error=repr(exc))
            await pause(0.5)


@map_errors
async def last_on_subject(nc: Connection, stream: str, subject: str) -> Stored | None:
    """The newest message on ``subject``; None when there is none."""
    try:
        msg = await nc.jetstream().get_last_msg(stream, subject)
    except nats.js.errors.NotFoundError:
        return None
    return Stored(int(msg.seq or 0), msg.subject or subject, msg.data or b"")


@map_errors
async def next_on_subject(nc: Connection, stream: str, subject: str, start: int) -> Stored | None:
    """The first message on ``subject`` (a filter: wildcards allowed) with a sequence of ``start`` or more; None
    when there is none."""
    try:
        msg = await nc.jetstream().get_msg(stream, seq=start, subject=subject, next=True)
    except nats.js.errors.NotFoundError:
        return None
    return Stored(int(msg.seq or 0), msg.subject or "", msg.data or b"")


@contextlib.asynccontextmanager
@map_errors
async def following(
    nc: Connection, stream: str, subject: str, on_message: Callable[[int, bytes], None]
) -> AsyncIterator[None]:
    """Hand every message on ``subject``, stored and new, to ``on_message(seq, data)``, in order, for as long as
    the block runs (an ordered consumer from the first message)."""

    async def on_msg(msg: Any) -> None:
        on_message(parse_js_reply(msg.reply).stream_seq, msg.data)

    sub = await nc.jetstream().subscribe(
        subject,
        stream=stream,
        cb=on_msg,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    try:
        yield
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()


@contextlib.asynccontextmanager
@map_errors
async def live(nc: Connection, subject: str, on_message: Callable[[bytes], Awaitable[None]]) -> AsyncIterator[None]:
    """Hand every message published on ``subject`` from now on to ``on_message(data)``, for as long as the block
    runs: a plain subscription, so nothing stored is replayed and one published while disconnected is missed (for
    what is a hint, like a service's down event to the supervisor that may kill its hung process)."""

    async def on_msg(msg: Any) -> None:
        await on_message(msg.data)

    sub = await nc.subscribe(subject, cb=on_msg)
    try:
        yield
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()


@map_errors
async def seq_before(nc: Connection, stream: str, since: datetime) -> int:
    """The sequence just before the first event stored at ``since`` or later (the stream's last sequence when
    there is none: only new events come after it)."""
    js = nc.jetstream()
    found: asyncio.Queue[int] = asyncio.Queue()

    async def on_msg(msg: Any) -> None:
        found.put_nowait(int(msg.metadata.sequence.stream))

    probe = await js.subscribe(
        f"{EVT_PREFIX}.>",
        stream=stream,
        cb=on_msg,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=since.astimezone(UTC)),
    )
    try:
        info = await probe.consumer_info()
        if (info.num_pending or 0) == 0 and found.empty():
            return await last_seq(nc, stream)  # nothing since then: only new events
        async with asyncio.timeout(FIRST_AFTER_TIME_WAIT_S):
            return await found.get() - 1
    finally:
        with contextlib.suppress(nats.errors.Error):
            await probe.unsubscribe()


@map_errors
async def account_storage(nc: Connection) -> Storage:
    info = await nc.jetstream().account_info()
    return Storage(used=int(info.storage), limit=int(info.limits.max_storage or 0))


@map_errors
async def consumer_floors(nc: Connection, stream: str) -> dict[str, int]:
    """Each consumer of the stream and the sequence up to which it has acknowledged everything."""
    infos: list[Any] = await nc.jetstream().consumers_info(stream)
    return {str(i.name): int(i.ack_floor.stream_seq if i.ack_floor else 0) for i in infos}
