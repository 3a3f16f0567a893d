"""Sending a command: the one way services, the CLI, the supervisor, plugins and benches put a typed command into
GT_CMD (docs/architecture.md, "Sending a command and asking a query").

The subject comes from the command's type (``BeadClose.SUBJECT``), followed by the sender's origin where it has one
(a service's or a polecat session's own subject, ``shared/subjects.py``); the body is the command encoded, without
the fields that hold their default; its ``cmd_id`` is the ``Nats-Msg-Id``, so a resend is stored once.

- ``store`` stores it, resending while the stream is briefly unreachable, and returns its GT_CMD sequence: what a
  service does (its outcome comes later, in the log it follows).
- ``send`` stores it and waits for its outcome: what a client does.

Outcomes are read from the log (an ordered consumer on ``gt.evt.cmd.<id>``), never from a plain subscription: a
plain subscriber also sees messages JetStream refused to store.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy

from shared import subjects
from shared.aio import pause, raise_if_cancelling
from shared.bus.append import MSG_ID, RETRYABLE_ERRORS, still_in_flight
from shared.bus.permissions import guarded
from shared.bus.query import ask
from shared.bus.topology import owner_of
from shared.commands import Command
from shared.config import TownConfig
from shared.errors import AppendFailedError, QueryError
from shared.events import decode_envelope
from shared.queries import Status

log = structlog.get_logger(__name__)

_ENCODER = msgspec.json.Encoder()
_DECODE = msgspec.json.Decoder()
STORE_DEADLINE_S = 30.0
"""How long a client's command may take to be stored while the stream is unreachable (resent meanwhile)."""
RETRY_PAUSE_S = 0.5
LIVENESS_TIMEOUT_S = 2.0
"""How long the status query that asks whether the owning service is there may take. Only nobody subscribing to
its queries (NATS's no responders) counts as down: a service too busy to answer that soon is there, and the
command's outcome is waited for until the sender's own timeout."""
_FOREVER_S = 365 * 24 * 3600.0


class Outcome(msgspec.Struct, kw_only=True):
    """What became of a command a client sent."""

    command_id: str
    stored_seq: int
    """Sequence of the command in GT_CMD."""
    outcome_seq: int | None = None
    """Sequence of the outcome event in GT_EVT."""
    type: str | None = None
    """``cmd.accepted`` or ``cmd.rejected``; None when no outcome arrived (yet)."""
    data: dict[str, Any] = {}
    """The outcome's payload: ``result`` and ``events`` when accepted, ``code`` and ``message`` when rejected."""
    service_down: bool = False
    """No outcome arrived and the owning service does not answer: the command waits in GT_CMD."""


def encode(cmd: Command) -> bytes:
    """The body of ``cmd`` as the services read it: JSON, every field that holds its default left out."""
    return _ENCODER.encode(cmd)


def subject_of(cmd: Command, origin: subjects.Origin | None = None) -> str:
    """Where ``origin`` (None: an operator) sends ``cmd``: its type's subject, followed by the origin's suffix."""
    return subjects.sent_subject(type(cmd).SUBJECT, origin)


def owner(cmd: Command) -> str:
    """The service that answers ``cmd``."""
    return owner_of(type(cmd).SUBJECT)


async def store(
    nc: Client,
    stream: str,
    cmd: Command,
    *,
    origin: subjects.Origin | None = None,
    deadline_s: float | None = STORE_DEADLINE_S,
    before_attempt: Callable[[], Awaitable[None]] | None = None,
) -> int:
    """Store ``cmd`` in ``stream`` (GT_CMD) with its ``cmd_id`` as the message id; return its sequence there.

    While the stream is briefly unreachable (a cluster electing a leader after losing a node, a reconnect) the
    command is resent, under the same id, so it is stored once, for up to ``deadline_s`` seconds (None: until
    stored or cancelled; 0: one attempt). ``before_attempt`` is awaited before each attempt (a service waits
    there until it may act).

    Raises:
        ValueError: ``cmd`` has no ``cmd_id``.
        AppendFailedError: the stream refused the command (too large, no such stream).
        PermissionDeniedError: this NATS user may not publish on the command's subject; nothing was stored.
        One of ``RETRYABLE_ERRORS``: the stream stayed unreachable past ``deadline_s``.
    """
    cmd_id = cmd.cmd_id
    if not cmd_id:
        raise ValueError(f"a {type(cmd).__name__} is stored with its cmd_id, which makes resending it harmless")
    subject = subject_of(cmd, origin)
    data = encode(cmd)
    js = nc.jetstream()
    give_up_at = None if deadline_s is None else time.monotonic() + deadline_s
    while True:
        raise_if_cancelling()
        if before_attempt is not None:
            await before_attempt()
        publish = js.publish(subject, data, stream=stream, headers={MSG_ID: cmd_id}, timeout=5)
        try:
            # A subject this user may not publish to is refused by the server at once; say so instead of
            # waiting out the acknowledgement's timeout (nothing was stored), and never retry it.
            ack = await guarded(nc, publish, subject=subject)
        except RETRYABLE_ERRORS as exc:
            if give_up_at is not None and time.monotonic() >= give_up_at:
                raise
            log.warning("command_store_retry", subject=subject, cmd_id=cmd_id, error=repr(exc))
        except nats.js.errors.APIError as exc:
            if not still_in_flight(exc) or (give_up_at is not None and time.monotonic() >= give_up_at):
                raise AppendFailedError(subject, exc.code, exc.err_code, exc.description or "") from exc
            log.info("command_store_in_flight", subject=subject, cmd_id=cmd_id)
        else:
            return int(ack.seq)
        await pause(RETRY_PAUSE_S)


async def send(
    nc: Client,
    config: TownConfig,
    cmd: Command,
    *,
    origin: subjects.Origin | None = None,
    timeout: float | None,
    wait_if_down: bool = False,
) -> Outcome:
    """Store ``cmd`` (see ``store``; it must carry its ``cmd_id``) and wait up to ``timeout`` seconds (None:
    forever) for its outcome. When the owning service does not answer queries, return right after storing
    (``service_down``) unless ``wait_if_down``.

    Raises what ``store`` raises; nothing else once the command is stored.
    """
    assert cmd.cmd_id, "a command is sent with its cmd_id"
    # Created before the command is stored, so the outcome cannot slip past it.
    sub = await nc.jetstream().subscribe(
        subjects.outcome_subject(cmd.cmd_id),
        stream=config.evt_stream,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    try:
        seq = await store(nc, config.cmd_stream, cmd, origin=origin)
        outcome = Outcome(command_id=cmd.cmd_id, stored_seq=seq)
        arrival = asyncio.ensure_future(sub.next_msg(timeout=timeout if timeout is not None else _FOREVER_S))
        try:
            if not wait_if_down:
                liveness = asyncio.ensure_future(_answers(nc, owner(cmd)))
                await asyncio.wait({arrival, liveness}, return_when=asyncio.FIRST_COMPLETED)
                if not arrival.done() and liveness.done() and not liveness.result():
                    outcome.service_down = True
                    return outcome
            msg = await arrival
        except (TimeoutError, nats.errors.TimeoutError):
            return outcome
        finally:
            arrival.cancel()
        env = decode_envelope(msg.data)
        outcome.type = env.type
        outcome.outcome_seq = subjects.parse_js_reply(msg.reply).stream_seq
        outcome.data = _DECODE.decode(env.data)
        return outcome
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()


async def _answers(nc: Client, service: str) -> bool:
    """Whether an instance of ``service`` is there: it answers a status query (any answer counts) or at least
    subscribes to them. A loaded town's service may take seconds to answer; calling it down then made `gt` say
    "the mayor is not running" of a running mayor and give up on an outcome that came a moment later."""
    try:
        await ask(nc, Status(service=service), timeout=LIVENESS_TIMEOUT_S)
    except QueryError as exc:
        return exc.code != "unavailable"
    return True
