"""Appending events with per-aggregate optimistic concurrency, atomically, and retry-safe.

One event is a plain JetStream publish with ``Nats-Expected-Last-Subject-Sequence`` (or, when it has no
expected sequence, with ``Nats-Msg-Id`` so the dedupe window catches a retry). Several events are one
atomic batch (ADR-50): all stored or none. A retry after a timeout or reconnect resends the same events;
if the first attempt had landed, the concurrency check fails and the appender reads the last message on
the final event's subject: when that is our event, the append succeeded and is reported once.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import nats.errors
import nats.js.errors
import structlog

from shared.bus.connection import Connection
from shared.bus.errors import map_errors, retryable
from shared.core.aio import pause, raise_if_cancelling
from shared.core.errors import AppendConflictError, AppendFailedError, AppendTimeoutError, EventDecodeError
from shared.model.events import decode_envelope

log = structlog.get_logger(__name__)

EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
MSG_ID = "Nats-Msg-Id"
BATCH_ID = "Nats-Batch-Id"
BATCH_SEQ = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"
MAX_BATCH_MESSAGES = 1000
"""nats-server refuses larger atomic batches (err_code 10199)."""

# nats-server error codes (server/errors.json).
ERR_WRONG_LAST_SEQUENCE = 10071
ERR_BATCH_WRONG_LAST_SEQUENCE = 10164  # a batch wrote one subject twice with an expected sequence
ERR_BATCH_INCOMPLETE = 10176  # batch messages lost on the way (reconnect) or abandoned: resend it
ERR_MAX_PAYLOAD = 10054  # "message size exceeds maximum allowed" (also used for the client-side refusal)
ERR_DUPLICATE_IN_PROCESS = 10158  # clustered: a resend while the first copy is still being replicated
ERR_ACCOUNT_RESOURCES = 10002  # "resource limits exceeded for account": its JetStream storage limit (max_file)
STORED_OVERHEAD = 64
"""Bytes a stored message takes beyond its subject and data (headers, framing), about."""
_CONFLICT_CODES = frozenset({ERR_WRONG_LAST_SEQUENCE, ERR_BATCH_WRONG_LAST_SEQUENCE})
_LAST_SEQ_RE = re.compile(r"wrong last sequence: (\d+)")


def still_in_flight(exc: BaseException) -> bool:
    """A clustered stream's answer to a resend (same message id) while the first copy is still being
    replicated: its fate is not known yet, so the resend is retried until the stream says stored or duplicate."""
    return isinstance(exc, nats.js.errors.APIError) and exc.err_code == ERR_DUPLICATE_IN_PROCESS


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


class _BatchIncompleteError(Exception):
    """The server lost part of a batch; resending the whole batch is safe."""


class _InFlightError(Exception):
    """A clustered stream still replicates the first copy of this resend; ask again."""


def _resendable(exc: BaseException) -> bool:
    """After a timeout, a lost connection or no answer an append's fate is unknown and a resend (recognised by its
    concurrency check or message id) is the way forward; so it is after the server lost part of a batch, or is still
    replicating the first copy."""
    return isinstance(exc, (_BatchIncompleteError, _InFlightError)) or retryable(exc)


class Appender:
    """Appends to one stream. Safe to share between tasks; appends to different aggregates run concurrently."""

    def __init__(
        self,
        nc: Connection,
        stream: str,
        *,
        attempt_timeout: float = 5.0,
        deadline: float = 60.0,
        guard: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._nc = nc
        self._guard = guard
        """Awaited right before every attempt: waits while the service is paused, raises to refuse the attempt
        (a service that is not the active one)."""
        self._js = nc.jetstream()
        self._stream = stream
        self._attempt_timeout = attempt_timeout
        self._deadline = deadline
        self._replicas: int | None = None
        self.retries = 0

    @map_errors
    async def append(self, events: Sequence[PendingEvent]) -> list[int]:
        """Store ``events`` (atomically when several) and return their stream sequences.

        Raises:
            AppendConflictError: an expected sequence did not match (someone else moved first).
            AppendFailedError: the server refused for another reason (too large, no stream, ...).
            AppendTimeoutError: no acknowledgement before the deadline; the outcome is unknown.
            ValueError: the events cannot be appended retry-safely (see below).
        """
        if not events:
            return []
        if len(events) > MAX_BATCH_MESSAGES:
            raise ValueError(f"{len(events)} events in one append; the limit is {MAX_BATCH_MESSAGES}")
        if len(events) > 1 and events[-1].expected_seq is None:
            # A resent batch is recognised by the last event's concurrency check; without one a retry
            # after a lost acknowledgement could store the batch twice.
            raise ValueError("the last event of a multi-event append must carry an expected sequence")
        give_up_at = time.monotonic() + self._deadline
        uncertain = False
        attempt = 0
        while True:
            raise_if_cancelling()
            if self._guard is not None:
                await self._guard()
            attempt += 1
            try:
                last_seq = await self._attempt(events)
            except nats.errors.MaxPayloadError as exc:
                subject = events[-1].subject
                raise AppendFailedError(
                    subject, None, ERR_MAX_PAYLOAD, f"message exceeds the server's max payload: {exc}"
                ) from exc
            except AppendConflictError:
                if uncertain:
                    stored = await self._find_own(events[-1])
                    if stored is not None:
                        log.info("append_retry_found_stored", subject=events[-1].subject, seq=stored)
                        return list(range(stored - len(events) + 1, stored + 1))
                raise
            except Exception as exc:
                if not _resendable(exc):
                    raise
                uncertain = True
                self.retries += 1
                if len(events) > 1:
                    full = await self._storage_full(events)
                    if full is not None:
                        raise full from exc
                if time.monotonic() >= give_up_at:
                    raise AppendTimeoutError(events[-1].subject, attempt) from exc
                log.warning("append_retry", subject=events[-1].subject, attempt=attempt, error=type(exc).__name__)
                await pause(min(1.0, 0.05 * 2 ** min(attempt, 5)))
                continue
            return list(range(last_seq - len(events) + 1, last_seq + 1))

    async def _attempt(self, events: Sequence[PendingEvent]) -> int:
        if len(events) == 1:
            ev = events[0]
            if ev.expected_seq is not None:
                headers = {EXPECTED_LAST_SUBJECT_SEQ: str(ev.expected_seq)}
            else:
                headers = {MSG_ID: ev.event_id}
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

    async def _storage_full(self, events: Sequence[PendingEvent]) -> AppendFailedError | None:
        """Why a batch came back incomplete or unanswered, when it is that the account cannot hold it.

        A batch message that would cross the account's JetStream storage limit is dropped without an answer (it
        was published without a reply subject), so the commit reports the batch incomplete; a batch whose
        messages each fit but not all together gets no answer to its commit at all (nats-server 2.15). Resending
        cannot help then: the account's own figures say so, and the append is refused like a single message
        would be (``ERR_ACCOUNT_RESOURCES``). None when they leave room (or cannot be read): resend as usual."""
        try:
            info = await self._js.account_info()
            if self._replicas is None:
                self._replicas = max(1, int((await self._js.stream_info(self._stream)).config.num_replicas or 1))
        except (TimeoutError, nats.errors.Error):
            return None
        limit = info.limits.max_storage
        if not limit or limit < 0:
            return None  # no limit on the account (-1)
        # Usage counts every replica (so does the limit); each message stores its subject and some framing.
        needed = self._replicas * sum(len(ev.subject) + len(ev.data) + STORED_OVERHEAD for ev in events)
        left = limit - int(info.storage)
        if left >= needed:
            return None
        return AppendFailedError(
            events[-1].subject,
            400,
            ERR_ACCOUNT_RESOURCES,
            f"resource limits exceeded for account: the account's JetStream storage has {max(0, left)} of "
            f"{limit} bytes left, the {len(events)} events need {needed}",
        )

    def _check(self, data: bytes, subject: str, expected: int | None) -> int:
        try:
            ack = _ACK_DECODER.decode(data)
        except msgspec.DecodeError as exc:
            raise AppendFailedError(subject, None, None, f"unreadable acknowledgement {data[:200]!r}") from exc
        if ack.error is not None:
            err = ack.error
            if err.err_code in _CONFLICT_CODES:
                match = _LAST_SEQ_RE.search(err.description)
                actual = int(match.group(1)) if match else None
                raise AppendConflictError(subject, expected, actual, err.description)
            if err.err_code == ERR_BATCH_INCOMPLETE:
                raise _BatchIncompleteError(err.description)
            if err.err_code == ERR_DUPLICATE_IN_PROCESS:
                raise _InFlightError(err.description)
            raise AppendFailedError(subject, err.code, err.err_code, err.description)
        if ack.seq <= 0:
            raise AppendFailedError(subject, None, None, f"acknowledgement without sequence {data[:200]!r}")
        return ack.seq

    @map_errors
    async def last_on_subject(self, subject: str) -> tuple[int, bytes] | None:
        """The last stored message on ``subject`` as (sequence, data), or None when there is none.

        Read from the stream leader (not a direct get), so it sees every acknowledged write.
        """
        give_up_at = time.monotonic() + self._deadline
        while True:
            raise_if_cancelling()
            try:
                msg = await self._js.get_last_msg(self._stream, subject)
            except nats.js.errors.NotFoundError:
                return None
            except (TimeoutError, nats.errors.Error) as exc:
                if not retryable(exc):
                    raise
                if time.monotonic() >= give_up_at:
                    raise AppendTimeoutError(subject, 0) from exc
                await pause(0.2)
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
        except EventDecodeError:
            return None  # a foreign, undecodable message there is simply not ours
