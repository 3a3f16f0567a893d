"""Sending a command: the one way services, the CLI, the supervisor, plugins and benches put a typed command into
GT_CMD (docs/architecture.md, "Sending a command and asking a query").

The subject comes from the command's type (``BeadClose.SUBJECT``), followed by the sender's origin where it has one
(a service's or a polecat session's own subject, ``shared/core/subjects.py``); the body is the command encoded, without
the fields that hold their default; its ``cmd_id`` is the ``Nats-Msg-Id``, so a resend is stored once.

- ``store`` stores it, resending while the stream is briefly unreachable, and returns its GT_CMD sequence: what a
  service does (its outcome comes later, in the log it follows).
- ``send`` stores it and waits for its outcome: what a client does.

Outcomes are read from the log, never from a plain subscription (a plain subscriber also sees messages JetStream
refused to store): a direct get of the last message on ``gt.evt.cmd.<id>``, read again until it is there. Any
replica answers a direct get, so no consumer is created per command: creating one asks the cluster's meta leader,
and one placed on a node that is down never answers.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic

import msgspec
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client

from shared.bus import streams
from shared.bus.append import ERR_MAX_PAYLOAD, MSG_ID, still_in_flight
from shared.bus.errors import map_errors, retryable
from shared.bus.permissions import guarded
from shared.bus.query import ask
from shared.bus.topology import owner_of
from shared.core import ids, subjects
from shared.core.aio import pause, raise_if_cancelling
from shared.core.config import TownConfig
from shared.core.errors import AppendFailedError, QueryError
from shared.model.commands import Command
from shared.model.commands.base import Creates, result_type
from shared.model.events import CommandAccepted, CommandRejected, decode_envelope
from shared.model.queries import Status
from shared.model.results import R

log = structlog.get_logger(__name__)

_ENCODER = msgspec.json.Encoder()
_REJECTED = msgspec.json.Decoder(CommandRejected)
STORE_DEADLINE_S = 30.0
"""How long a client's command may take to be stored while the stream is unreachable (resent meanwhile)."""
RETRY_PAUSE_S = 0.5
STORE_ACK_TIMEOUT_S = 5.0
"""How long one attempt to store a command waits for JetStream's acknowledgement before it is resent (same id)."""
LIVENESS_DELAY_S = 0.1
"""How long a sender waits for the outcome before it asks whether the owning service is there at all: a command
settles in milliseconds, and asking every time cost the service a query per command (answered while it settles
that very command)."""
LIVENESS_TIMEOUT_S = 2.0
"""How long the status query that asks whether the owning service is there may take. Only nobody subscribing to
its queries (NATS's no responders) counts as down: a service too busy to answer that soon is there, and the
command's outcome is waited for until the sender's own timeout."""
OUTCOME_POLL_FIRST_S = 0.001
"""The pause between the first reads of a command's outcome (``read_outcome``): a command settles 1-3 ms after it
is stored (measured: the mayor publishes a create's outcome 1.5 ms after the store's acknowledgement)."""
OUTCOME_POLL_DENSE = 4
"""How many reads are made ``OUTCOME_POLL_FIRST_S`` apart before the pause starts doubling."""
OUTCOME_POLL_MAX_S = 0.25
"""The longest pause between reads of a command's outcome: a slow command's is read within this of being stored."""
OUTCOME_READ_TIMEOUT_S = 2.0
"""How long one read of an outcome may go unanswered before it is made again."""


class NoAnswer(msgspec.Struct):
    """An outcome's ``data`` before its outcome arrived: nothing (``{}``)."""


class Outcome(msgspec.Struct, Generic[R], kw_only=True):
    """What became of a command a client sent (``--json`` prints it as it is: ``data`` is the outcome's payload as
    the log holds it)."""

    command_id: str
    stored_seq: int
    """Sequence of the command in GT_CMD."""
    outcome_seq: int | None = None
    """Sequence of the outcome event in GT_EVT."""
    type: str | None = None
    """``cmd.accepted`` or ``cmd.rejected``; None when no outcome arrived (yet)."""
    data: CommandAccepted[R] | CommandRejected | NoAnswer = msgspec.field(default_factory=NoAnswer)
    """The outcome's payload: ``result`` (the command's result type) and ``events`` when accepted, ``code`` and
    ``message`` when rejected."""
    service_down: bool = False
    """No outcome arrived and the owning service does not answer: the command waits in GT_CMD."""
    new_id: str | None = None
    """The id of what the command creates, as its sender chose it (``Creates.new_id``): known with or without an
    answer, so a script reads the id from ``--json`` while the service is down too."""

    @property
    def accepted(self) -> CommandAccepted[R] | None:
        return self.data if isinstance(self.data, CommandAccepted) else None

    @property
    def rejected(self) -> CommandRejected | None:
        return self.data if isinstance(self.data, CommandRejected) else None

    @property
    def result(self) -> R:
        """The accepted command's result.

        Raises:
            LookupError: the command was not accepted (rejected, or no outcome yet).
        """
        accepted = self.accepted
        if accepted is None:
            raise LookupError(f"command {self.command_id} has no result: {self.type or 'no outcome yet'}")
        return accepted.result


@functools.cache
def _accepted_decoder(result: Any) -> msgspec.json.Decoder[CommandAccepted[Any]]:
    return msgspec.json.Decoder(CommandAccepted[result])


def read_payload(cmd_type: type[Command[R]], event_type: str, data: bytes) -> CommandAccepted[R] | CommandRejected:
    """The payload of a ``cmd_type`` command's outcome of ``event_type``, its result read into the command's result
    type. An accepted outcome whose result does not fit that type (written by a version that answered otherwise)
    is read as the JSON it holds, and logged: once the command is stored, reading its outcome never fails."""
    if event_type == CommandRejected.TYPE:
        return _REJECTED.decode(data)
    try:
        accepted: CommandAccepted[R] = _accepted_decoder(result_type(cmd_type)).decode(data)
    except msgspec.ValidationError as exc:
        log.warning("command_result_unreadable", command=cmd_type.SUBJECT, error=str(exc))
        accepted = _accepted_decoder(Any).decode(data)
    return accepted


def encode(cmd: Command) -> bytes:
    """The body of ``cmd`` as the services read it: JSON, every field that holds its default left out."""
    return _ENCODER.encode(cmd)


def subject_of(cmd: Command, origin: subjects.Origin | None = None) -> str:
    """Where ``origin`` (None: an operator) sends ``cmd``: its type's subject, followed by the origin's suffix."""
    return subjects.sent_subject(type(cmd).SUBJECT, origin)


def owner(cmd: Command) -> str:
    """The service that answers ``cmd``."""
    return owner_of(type(cmd).SUBJECT)


@map_errors
async def store(
    nc: Client,
    stream: str,
    cmd: Command,
    *,
    evt_stream: str,
    origin: subjects.Origin | None = None,
    deadline_s: float | None = STORE_DEADLINE_S,
    before_attempt: Callable[[], Awaitable[None]] | None = None,
    on_retry: Callable[[str], None] | None = None,
) -> StoredCommand:
    """Store ``cmd`` in ``stream`` (GT_CMD) with its ``cmd_id`` as the message id; return its sequence there and
    the id it was stored under.

    While the stream is briefly unreachable (a cluster electing a leader after losing a node, a reconnect) the
    command is resent, under the same id, so it is stored once, for up to ``deadline_s`` seconds (None: until
    stored or cancelled; 0: one attempt), each resend told to ``on_retry`` (why). ``before_attempt`` is awaited
    before each attempt (a service waits there until it may act).

    GT_CMD keeps one message per id for two minutes, whoever sent it. A service or the operator whose command comes
    back as a duplicate of a message some other sender stored (a session that sent ``close-<mr>`` first, to have
    the refinery's close of that bead dropped) sends it again under a fresh id (``taken_by_another``); a polecat
    session, which may not read GT_CMD, sends ids no other sender can guess (``ids.keyed_id``).

    Raises:
        ValueError: ``cmd`` has no ``cmd_id``.
        AppendFailedError: the stream refused the command (too large, no such stream).
        PermissionDeniedError: this NATS user may not publish on the command's subject; nothing was stored.
        BusError: a retryable one (``GastownError.retryable``): the stream stayed unreachable past ``deadline_s``.
    """
    if not cmd.cmd_id:
        raise ValueError(f"a {type(cmd).__name__} is stored with its cmd_id, which makes resending it harmless")
    cmd_id = ids.command_id(cmd.cmd_id, None, 0)
    if cmd_id != cmd.cmd_id:
        # What the intake would settle it under (an id that cannot be a subject token becomes its digest): the
        # message id, the body and the outcome's subject then name the same id.
        cmd = msgspec.structs.replace(cmd, cmd_id=cmd_id)
    subject = subject_of(cmd, origin)
    data = encode(cmd)
    js = nc.jetstream()
    give_up_at = None if deadline_s is None else time.monotonic() + deadline_s
    asked_for_stream = False
    while True:
        raise_if_cancelling()
        if before_attempt is not None:
            await before_attempt()
        publish = js.publish(subject, data, stream=stream, headers={MSG_ID: cmd_id}, timeout=STORE_ACK_TIMEOUT_S)
        try:
            # A subject this user may not publish to is refused by the server at once; say so instead of
            # waiting out the acknowledgement's timeout (nothing was stored), and never retry it.
            ack = await guarded(nc, publish, subject=subject)
        except (TimeoutError, nats.errors.Error) as exc:
            if retryable(exc):
                if give_up_at is not None and time.monotonic() >= give_up_at:
                    raise
                if isinstance(exc, nats.js.errors.NoStreamResponseError) and not asked_for_stream:
                    # Also what a stream electing its leader answers; but a town never provisioned says so at once.
                    asked_for_stream = True
                    if not await _stream_exists(nc, stream):
                        raise
                log.warning("command_store_retry", subject=subject, cmd_id=cmd_id, error=repr(exc))
                if on_retry is not None:
                    on_retry(f"NATS did not store the command yet: {type(exc).__name__}")
            elif isinstance(exc, nats.errors.MaxPayloadError):
                # Over the largest message the server carries: refused by the client, nothing was sent.
                raise AppendFailedError(
                    subject, None, ERR_MAX_PAYLOAD, f"the command is {len(data)} bytes, over the server's max payload"
                ) from exc
            elif isinstance(exc, nats.js.errors.APIError):
                if not still_in_flight(exc) or (give_up_at is not None and time.monotonic() >= give_up_at):
                    raise AppendFailedError(subject, exc.code, exc.err_code, exc.description or "") from exc
                log.info("command_store_in_flight", subject=subject, cmd_id=cmd_id)
            else:
                raise
        else:
            if not ack.duplicate or subjects.id_scope(origin) is not None:
                return StoredCommand(seq=int(ack.seq), cmd_id=cmd_id)
            taker = await _taken_by_another(nc, stream, evt_stream, int(ack.seq), subject, cmd_id)
            if taker is None:
                return StoredCommand(seq=int(ack.seq), cmd_id=cmd_id)
            fresh = f"{cmd_id[:55]}-{secrets.token_hex(4)}"
            log.warning("command_id_taken", cmd_id=cmd_id, taken_on=taker, sent_again_as=fresh)
            cmd = msgspec.structs.replace(cmd, cmd_id=fresh)
            cmd_id, data = fresh, encode(cmd)
            continue
        await pause(RETRY_PAUSE_S)


class StoredCommand(msgspec.Struct, frozen=True, kw_only=True):
    """A command as GT_CMD holds it: its sequence there and the id it is settled under."""

    seq: int
    cmd_id: str


StoreCommand = Callable[[Command], Awaitable[StoredCommand]]
"""A service's ``store`` as the parts it hands it to see it (``ServiceBase.store``)."""

TAKEN_UNKNOWN = "(consumed)"
"""What ``_taken_by_another`` names when the earlier message is gone from GT_CMD and left no outcome of this id."""


async def _taken_by_another(
    nc: Client, stream: str, evt_stream: str, seq: int, subject: str, cmd_id: str
) -> str | None:
    """The subject of the message that holds ``cmd_id`` in GT_CMD's dedupe window when it is not this sender's
    own earlier copy (same subject), else None. A message already consumed is this sender's when its outcome is
    in the log under ``cmd_id`` (another sender's would be under its own scope, or not this command's)."""
    try:
        stored = await nc.jetstream().get_msg(stream, seq)
    except nats.js.errors.NotFoundError:
        stored = None
    except (TimeoutError, nats.errors.Error) as exc:
        # Not to be told now (a stream electing its leader): taken for its own, as a duplicate always was.
        log.warning("command_duplicate_unchecked", cmd_id=cmd_id, seq=seq, error=repr(exc))
        return None
    if stored is not None:
        return None if stored.subject == subject else str(stored.subject)
    settled = await _has_outcome(nc, evt_stream, cmd_id)
    return TAKEN_UNKNOWN if settled is False else None


async def _has_outcome(nc: Client, evt_stream: str, cmd_id: str) -> bool | None:
    """Whether the log holds an outcome of ``cmd_id``; None when it cannot say now (then the command is taken for
    the sender's own: carrying one out twice is worse than a duplicate dropped)."""
    request = f"$JS.API.DIRECT.GET.{evt_stream}.{subjects.outcome_subject(cmd_id)}"
    try:
        reply = await nc.request(request, b"", timeout=OUTCOME_READ_TIMEOUT_S)
    except (TimeoutError, nats.errors.Error):
        return None
    status = (reply.headers or {}).get("Status")
    if status is None:
        return True
    return False if status == "404" else None


STREAM_CHECK_TIMEOUT_S = 1.0


async def _stream_exists(nc: Client, stream: str) -> bool:
    """False only when JetStream says there is no such stream; True while it cannot say (an election, a user who
    may not ask: a polecat session's)."""
    try:
        return await streams.exists(nc, stream, timeout=STREAM_CHECK_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - anything but a clear "no such stream" leaves the store retrying
        return True


@map_errors
async def send(
    nc: Client,
    config: TownConfig,
    cmd: Command[R],
    *,
    origin: subjects.Origin | None = None,
    timeout: float | None,
    wait_if_down: bool = False,
    store_deadline_s: float = STORE_DEADLINE_S,
    on_retry: Callable[[str], None] | None = None,
) -> Outcome[R]:
    """Store ``cmd`` (see ``store``, resending for up to ``store_deadline_s`` while the stream is unreachable; it
    must carry its ``cmd_id``) and wait up to ``timeout`` seconds (None: forever) for its outcome. When the owning
    service does not answer queries, return right after storing (``service_down``) unless ``wait_if_down``.

    Raises what ``store`` raises; nothing else once the command is stored.
    """
    assert cmd.cmd_id, "a command is sent with its cmd_id"
    stored = await store(
        nc,
        config.cmd_stream,
        cmd,
        evt_stream=config.evt_stream,
        origin=origin,
        deadline_s=store_deadline_s,
        on_retry=on_retry,
    )
    # An agent's command is settled in its own namespace (``ids.session_scoped_id``), so its outcome is there.
    settled_as = stored.cmd_id
    if (scope := subjects.id_scope(origin)) is not None:
        settled_as = ids.session_scoped_id(scope, stored.cmd_id)
    outcome: Outcome[R] = Outcome(
        command_id=settled_as, stored_seq=stored.seq, new_id=cmd.new_id if isinstance(cmd, Creates) else None
    )
    arrival = asyncio.ensure_future(read_outcome(nc, config.evt_stream, settled_as, timeout=timeout))
    liveness: asyncio.Future[bool] | None = None
    try:
        if not wait_if_down:
            liveness = asyncio.ensure_future(_answers(nc, owner(cmd), delay_s=LIVENESS_DELAY_S))
            await asyncio.wait({arrival, liveness}, return_when=asyncio.FIRST_COMPLETED)
            if not arrival.done() and liveness.done() and not liveness.result():
                outcome.service_down = True
                return outcome
        found = await arrival
    finally:
        arrival.cancel()
        if liveness is not None:
            liveness.cancel()
    if found is None:
        return outcome
    outcome.outcome_seq, data = found
    env = decode_envelope(data)
    outcome.type = env.type
    if env.type in (CommandAccepted.TYPE, CommandRejected.TYPE):
        outcome.data = read_payload(type(cmd), env.type, env.data)
    return outcome


@map_errors
async def read_outcome(nc: Client, stream: str, cmd_id: str, *, timeout: float | None) -> tuple[int, bytes] | None:
    """The outcome of command ``cmd_id`` as the log holds it, (sequence, data), read as soon as it is stored; None
    when none is within ``timeout`` seconds (None: wait for it). An outcome stored before the call (a resent
    command's) is found at once.

    Read with a direct get of the last message on its subject, again while it is not there: ``OUTCOME_POLL_DENSE``
    times ``OUTCOME_POLL_FIRST_S`` apart, then after a pause that doubles up to ``OUTCOME_POLL_MAX_S``: a command
    settles in milliseconds, so a few reads find it. A read that gets no answer (a replica that went down, a stream
    electing its leader) is simply made again.

    Raises:
        PermissionDeniedError: this NATS user may not read the log (said at the first read, not after ``timeout``).
    """
    request = f"$JS.API.DIRECT.GET.{stream}.{subjects.outcome_subject(cmd_id)}"
    loop = asyncio.get_running_loop()
    give_up_at = None if timeout is None else loop.time() + timeout
    pause_s = OUTCOME_POLL_FIRST_S
    reads = 0
    first = True
    while True:
        per_read = OUTCOME_READ_TIMEOUT_S
        if give_up_at is not None:
            per_read = min(per_read, max(give_up_at - loop.time(), 0.001))
        read = nc.request(request, b"", timeout=per_read)
        try:
            reply = await (guarded(nc, read, subject=request) if first else read)
        except (TimeoutError, nats.errors.TimeoutError, nats.errors.NoRespondersError):
            reply = None
        first = False
        headers = (reply.headers or {}) if reply is not None else {}
        if reply is not None and "Status" not in headers and "Nats-Sequence" in headers:
            return int(headers["Nats-Sequence"]), reply.data
        # Not stored yet (404), or no answer: read again.
        if give_up_at is not None and loop.time() >= give_up_at:
            return None
        await asyncio.sleep(pause_s if give_up_at is None else max(0.0, min(pause_s, give_up_at - loop.time())))
        reads += 1
        if reads >= OUTCOME_POLL_DENSE:
            pause_s = min(OUTCOME_POLL_MAX_S, pause_s * 2)


async def _answers(nc: Client, service: str, *, delay_s: float = 0.0) -> bool:
    """Whether an instance of ``service`` is there: it answers a status query (any answer counts) or at least
    subscribes to them. A loaded town's service may take seconds to answer; calling it down then made `gt` say
    "the mayor is not running" of a running mayor and give up on an outcome that came a moment later. Asked after
    ``delay_s``."""
    await asyncio.sleep(delay_s)
    try:
        await ask(nc, Status(service=service), timeout=LIVENESS_TIMEOUT_S)
    except QueryError as exc:
        return exc.code != "unavailable"
    return True
