"""Reading a stream by direct gets, and keeping a small record in a KV bucket that never ages out: what a client
with no JetStream consumer of its own can do (the plugins, in account PLUGINS: ops/nats/accounts.conf imports them
direct gets of GT_EVT and of their marks bucket, nothing that creates a consumer).

``read_batch`` asks for up to ``batch`` messages from a sequence in one request (the batch form of a direct get,
nats-server 2.11 and later; nats-py 2.16 has no helper for it): the server answers with the messages, in order,
each carrying ``Nats-Sequence``, ``Nats-Num-Pending`` (messages left after it) and ``Nats-Last-Sequence`` (the one
sent before it in this answer), then a ``204 EOB`` status naming the last one it sent. Answers travel as plain
messages, so one may be lost on the way (a slow client's are dropped): a batch is cut at the first message whose
predecessor did not arrive, and what was cut is read again by the next request. ``last_per_subject`` reads the
newest message of every subject matching some filters in one request the same way (``multi_last``).

A failure of NATS raises ``BusError`` (``shared.bus.errors``): ``NatsNotAnsweringError`` when the stream is not there
or JetStream does not answer, ``BusTimeoutError`` when nothing answers in time (both retryable), ``LogReadError``
when the server refused the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, NamedTuple

import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg

from shared.bus.connection import Connection
from shared.bus.errors import map_errors
from shared.bus.streams import Stored
from shared.core.errors import JetStreamApiError

log = structlog.get_logger(__name__)

READ_TIMEOUT_S = 5.0
"""Silence this long in the middle of an answer means it (or the request) was lost."""
ERR_MSG_TTL_DISABLED = 10166
SEQUENCE = "Nats-Sequence"
SUBJECT = "Nats-Subject"
NUM_PENDING = "Nats-Num-Pending"
LAST_SEQUENCE = "Nats-Last-Sequence"


class LogReadError(JetStreamApiError):
    """The server refused a direct get (a malformed request, a server too old for batches)."""

    def __init__(self, stream: str, status: str, description: str) -> None:
        self.stream = stream
        self.status = status
        super().__init__(
            description,
            code=int(status) if status.isdigit() else None,
            err_code=None,
            kind="LogReadError",
            message=f"direct get on {stream} refused: {status} {description}",
        )


class Batch(NamedTuple):
    """What one batched direct get brought."""

    messages: list[Stored]
    """In stream order, contiguous (no message the server sent in between is missing)."""
    pending: int
    """Messages (matching the filter, if any) stored after the last one, as the server counted when it answered; 0
    when none came."""


@map_errors
async def read_batch(
    nc: Connection,
    stream: str,
    from_seq: int,
    batch: int,
    max_bytes: int,
    *,
    subject: str | None = None,
    timeout: float = READ_TIMEOUT_S,
) -> Batch:
    """Up to ``batch`` messages of ``stream`` from ``from_seq`` (1 or more) on, stopping once ``max_bytes`` were sent
    (always at least one); only those on ``subject`` (a filter, wildcards allowed) when given. An empty batch when
    there is none (yet).

    Raises:
        NatsNotAnsweringError: the stream is not there, or JetStream does not answer.
        BusTimeoutError: no answer at all within ``timeout``.
        LogReadError: the server refused the request.
    """
    if from_seq < 1 or batch < 1:
        raise ValueError(f"a batch starts at sequence 1 or later and holds 1 or more (got {from_seq}, {batch})")
    request: dict[str, Any] = {"seq": from_seq, "batch": batch, "max_bytes": max_bytes}
    if subject is not None:
        request["next_by_subj"] = subject
    answers = await _ask(nc, f"$JS.API.DIRECT.GET.{stream}", request, stream, timeout)
    return _contiguous(stream, answers)


@map_errors
async def last_per_subject(
    nc: Connection, stream: str, subjects: list[str], *, timeout: float = READ_TIMEOUT_S
) -> dict[str, Stored]:
    """The newest message of every subject matching one of ``subjects`` (filters), by subject; {} when none does.

    Raises:
        as ``read_batch``.
    """
    answers = await _ask(nc, f"$JS.API.DIRECT.GET.{stream}", {"multi_last": subjects}, stream, timeout)
    return {stored.subject: stored for stored in (_stored(msg) for msg in answers if _is_data(msg))}


@map_errors
async def put_kept(nc: Connection, bucket: str, key: str, value: bytes) -> int:
    """Write ``key`` of KV ``bucket`` so that it never ages out with the bucket's TTL (``Nats-TTL: never``); its
    revision. A bucket made without per-message TTLs (by an older version) takes a plain write instead, which ages
    out with the bucket's TTL unless written again in time."""
    js = nc.jetstream()
    subject = f"$KV.{bucket}.{key}"
    try:
        ack = await js.publish(subject, value, headers={"Nats-TTL": "never"})
    except nats.js.errors.APIError as exc:
        if exc.err_code != ERR_MSG_TTL_DISABLED:
            raise
        log.warning("kv_ttl_refused", bucket=bucket, key=key)
        ack = await js.publish(subject, value)
    return int(ack.seq)


async def _ask(nc: Connection, api: str, request: dict[str, Any], stream: str, timeout: float) -> list[Msg]:
    """Every answer to one direct get, up to the end of its batch (the EOB status), or the single answer of a
    request that found nothing; [] when nothing was found."""
    inbox = nc.new_inbox()
    queue: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_msg(msg: Msg) -> None:
        queue.put_nowait(msg)

    sub = await nc.subscribe(inbox, cb=on_msg)
    answers: list[Msg] = []
    try:
        await nc.publish(api, json.dumps(request).encode(), reply=inbox)
        while True:
            try:
                async with asyncio.timeout(timeout):
                    msg = await queue.get()
            except TimeoutError:
                if not answers:
                    raise nats.errors.TimeoutError from None
                log.warning("direct_get_cut_short", stream=stream, received=len(answers))
                return answers  # the end was lost: what came is kept, as far as it is contiguous
            if _is_data(msg):
                answers.append(msg)
                continue
            status = str((msg.headers or {}).get("Status", ""))
            description = str((msg.headers or {}).get("Description", ""))
            if status == "204":  # EOB: the batch is complete
                answers.append(msg)
                return answers
            if status == "404":  # nothing there (yet), or nothing on the filter
                return answers
            if status == "503":
                raise nats.errors.NoRespondersError
            raise LogReadError(stream, status, description)
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()


def _is_data(msg: Msg) -> bool:
    # The server names every message it sends with its sequence; a status (EOB, 404, ...) has none.
    return SEQUENCE in (msg.headers or {})


def _stored(msg: Msg) -> Stored:
    headers = msg.headers or {}
    return Stored(int(headers[SEQUENCE]), str(headers.get(SUBJECT, "")), msg.data)


def _contiguous(stream: str, answers: list[Msg]) -> Batch:
    """The messages up to the first one whose predecessor in the answer is missing, and what is pending after the
    last one kept."""
    kept: list[Stored] = []
    pending = 0
    previous = 0
    for msg in answers:
        headers = msg.headers or {}
        sent_before = int(headers.get(LAST_SEQUENCE, "0") or 0)
        if sent_before != previous:
            # The server sent one between these two that never arrived: stop before the hole. (The EOB names the
            # last one sent: a mismatch there means the tail was lost; what came is kept.)
            if _is_data(msg):
                log.warning("direct_get_hole", stream=stream, after=previous, next=int(headers[SEQUENCE]))
            return Batch(kept, pending + 1)
        if not _is_data(msg):
            break
        stored = _stored(msg)
        kept.append(stored)
        previous = stored.seq
        pending = int(headers.get(NUM_PENDING, "0") or 0)
    return Batch(kept, pending)
