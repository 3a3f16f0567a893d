"""Appending events with per-aggregate optimistic concurrency, atomically, and retry-safe.

One event is a plain JetStream publish with ``Nats-Expected-Last-Subject-Sequence``. Several events are
one atomic batch (ADR-50): all stored or none. A retry after a timeout or reconnect resends the same
events; if the first attempt had landed, the concurrency check fails and the appender reads the last
event on the batch's final subject: if that is our event, the append succeeded (stored once).
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import Sequence

import msgspec
import nats.errors
import structlog
from nats.aio.client import Client
from nats.js.client import JetStreamContext

from shared.errors import AppendConflictError, AppendFailedError, AppendTimeoutError
from shared.events import decode_envelope

log = structlog.get_logger(__name__)

EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
BATCH_ID = "Nats-Batch-Id"
BATCH_SEQ = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"
ERR_WRONG_LAST_SEQUENCE = 10071
_LAST_SEQ_RE = re.compile(r"wrong last sequence: (\d+)")

_TRANSIENT = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    asyncio.TimeoutError,
)


class PendingEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An encoded event waiting to be appended. ``expected_seq`` None means no concurrency check."""

    subject: str
    data: bytes
    event_id: str
    expected_seq: int | None = None


class _ApiError(msgspec.Struct, frozen=True):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _PubAck(msgspec.Struct, frozen=True):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    count: int = 0
    error: _ApiError | None = None


_ACK_DECODER = msgspec.json.Decoder(_PubAck)


class Appender:
    """Appends to one stream. Safe to share between tasks; appends to different aggregates run concurrently."""

    def __init__(
        self,
        nc: Client,
        js: JetStreamContext,
        stream: str,
        *,
        attempt_timeout: float = 2.0,
        deadline: float = 60.0,
    ) -> None:
        self._nc = nc
        self._js = js
        self._stream = stream
        self._attempt_timeout = attempt_timeout
        self._deadline = deadline

    async def append(self, events: Sequence[PendingEvent]) -> list[int]:
        """Store ``events`` (atomically when several) and return their stream sequences.

        Raises:
            AppendConflictError: an expected sequence did not match (someone else moved first).
            AppendFailedError: the server refused for another reason (too large, no stream, ...).
            AppendTimeoutError: no acknowledgement before the deadline; the outcome is unknown.
        """
        if not events:
            return []
        give_up_at = time.monotonic() + self._deadline
        uncertain = False
        attempt = 0
        while True:
            attempt += 1
            try:
                last_seq = await self._attempt(events)
            except _TRANSIENT as exc:
                uncertain = True
                if time.monotonic() >= give_up_at:
                    raise AppendTimeoutError(events[-1].subject, attempt) from exc
                log.warning("append_retry", subject=events[-1].subject, attempt=attempt, error=type(exc).__name__)
                await asyncio.sleep(min(1.0, 0.05 * 2 ** min(attempt, 5)))
                continue
            except AppendConflictError:
                if uncertain:
                    stored = await self._find_own(events[-1])
                    if stored is not None:
                        log.info("append_retry_found_stored", subject=events[-1].subject, seq=stored)
                        return list(range(stored - len(events) + 1, stored + 1))
                raise
            return list(range(last_seq - len(events) + 1, last_seq + 1))

    async def _attempt(self, events: Sequence[PendingEvent]) -> int:
        if len(events) == 1:
            ev = events[0]
            headers = {EXPECTED_LAST_SUBJECT_SEQ: str(ev.expected_seq)} if ev.expected_seq is not None else None
            reply = await self._nc.request(ev.subject, ev.data, timeout=self._attempt_timeout, headers=headers)
            return self._check(reply.data, ev.subject, ev.expected_seq)
        batch_id = secrets.token_hex(8)
        last = len(events) - 1
        for index, ev in enumerate(events):
            headers = {BATCH_ID: batch_id, BATCH_SEQ: str(index + 1)}
            if ev.expected_seq is not None:
                headers[EXPECTED_LAST_SUBJECT_SEQ] = str(ev.expected_seq)
            if index < last:
                await self._nc.publish(ev.subject, ev.data, headers=headers)
            else:
                headers[BATCH_COMMIT] = "1"
                reply = await self._nc.request(ev.subject, ev.data, timeout=self._attempt_timeout, headers=headers)
                return self._check(reply.data, ev.subject, events[0].expected_seq)
        raise AssertionError("unreachable")

    def _check(self, data: bytes, subject: str, expected: int | None) -> int:
        try:
            ack = _ACK_DECODER.decode(data)
        except msgspec.DecodeError as exc:
            raise AppendFailedError(subject, None, None, f"unreadable acknowledgement {data[:200]!r}") from exc
        if ack.error is not None:
            err = ack.error
            if err.err_code == ERR_WRONG_LAST_SEQUENCE:
                match = _LAST_SEQ_RE.search(err.description)
                actual = int(match.group(1)) if match else None
                raise AppendConflictError(subject, expected, actual, err.description)
            raise AppendFailedError(subject, err.code, err.err_code, err.description)
        if ack.seq <= 0:
            raise AppendFailedError(subject, None, None, f"acknowledgement without sequence {data[:200]!r}")
        return ack.seq

    async def last_on_subject(self, subject: str) -> tuple[int, bytes] | None:
        """The last stored message on ``subject`` as (sequence, data), or None when there is none."""
        while True:
            try:
                msg = await self._js.get_last_msg(self._stream, subject)
            except nats.js.errors.NotFoundError:
                return None
            except _TRANSIENT:
                await asyncio.sleep(0.2)
                continue
            assert msg.seq is not None
            return msg.seq, msg.data or b""

    async def _find_own(self, ev: PendingEvent) -> int | None:
        found = await self.last_on_subject(ev.subject)
        if found is None:
            return None
        seq, data = found
        try:
            return seq if decode_envelope(data).id == ev.event_id else None
        except Exception:  # noqa: BLE001 (a foreign, undecodable message there is simply not ours)
            return None
