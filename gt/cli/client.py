"""What the CLI does over NATS: send a command and wait for its outcome, ask a query, read an aggregate's history.

Outcomes are read from the log (an ordered consumer on ``gt.evt.cmd.<id>``), never from a plain
subscription: a plain subscriber also sees messages JetStream refused to store.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy, PubAck

from gt.cli import hook_lease, identity
from gt.story import HistoryEntry, history_entry
from shared import subjects
from shared.aio import pause
from shared.bus.append import RETRYABLE_ERRORS, still_in_flight
from shared.bus.permissions import guarded
from shared.bus.topology import owner_of
from shared.config import TownConfig
from shared.errors import AppendFailedError
from shared.events import decode_envelope

_JSON = msgspec.json.Encoder()
_DECODE = msgspec.json.Decoder()
STORE_DEADLINE_S = 30.0
"""How long a command may take to be stored while the stream is unreachable (resent meanwhile)."""
LIVENESS_TIMEOUT_S = 2.0
"""How long a status query may take before the owning service counts as not answering."""


class Outcome(msgspec.Struct, kw_only=True):
    """What became of a command the CLI sent."""

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


async def send_command(
    nc: Client,
    config: TownConfig,
    subject: str,
    body: dict[str, Any],
    *,
    timeout: float | None,
    wait_if_down: bool = False,
) -> Outcome:
    """Store a command in GT_CMD and wait up to ``timeout`` (None: forever) for its outcome.

    When the owning service does not answer queries, return right after storing (``service_down``)
    unless ``wait_if_down``. A body without an ``actor`` gets the polecat's when sent from inside a session.

    Raises:
        AppendFailedError: GT_CMD refused the command (too large, stream missing).
        PermissionDeniedError: this NATS user may not publish to ``subject``; nothing was stored.
    """
    cmd_id = body.get("cmd_id") or f"cli-{secrets.token_hex(8)}"
    body = {**body, "cmd_id": cmd_id}
    subject = identity.command_subject(subject)
    actor = identity.default_actor(body.get("actor"))
    if actor is not None:
        body["actor"] = actor  # sent from a polecat session: the command is its polecat's
    fence = hook_lease.session_fence()
    if fence is not None and "fence" not in body:
        # Sent from inside a polecat session: carried out only while the session holds its bead's hook.
        body["fence"] = {"lease": fence.lease, "token": fence.token}
        await hook_lease.renew(nc, config, fence)
    js = nc.jetstream()
    out_subject = subjects.outcome_subject(cmd_id)
    # Created before the command is stored, so the outcome cannot slip past it.
    sub = await js.subscribe(
        out_subject,
        stream=config.evt_stream,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    try:
        ack = await _store_command(nc, config, subject, _JSON.encode(body), cmd_id)
        outcome = Outcome(command_id=cmd_id, stored_seq=ack.seq)
        arrival = asyncio.ensure_future(sub.next_msg(timeout=timeout if timeout is not None else 365 * 24 * 3600))
        try:
            if not wait_if_down:
                liveness = asyncio.ensure_future(_service_answers(nc, owner_of(subject)))
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


async def _store_command(nc: Client, config: TownConfig, subject: str, data: bytes, cmd_id: str) -> PubAck:
    """Publish the command to GT_CMD, resending it (same message id: stored once) while the stream is briefly
    unreachable, e.g. a cluster electing a new leader after losing a node, for up to ``STORE_DEADLINE_S``."""
    js = nc.jetstream()
    give_up_at = time.monotonic() + STORE_DEADLINE_S
    while True:
        publish = js.publish(subject, data, stream=config.cmd_stream, headers={"Nats-Msg-Id": cmd_id}, timeout=5)
        try:
            # A subject this user may not publish to is refused by the server at once; say so instead of
            # waiting out the acknowledgement's timeout (nothing was stored).
            return await guarded(nc, publish, subject=subject)
        except RETRYABLE_ERRORS:
            if time.monotonic() >= give_up_at:
                raise
        except nats.js.errors.APIError as exc:
            if not still_in_flight(exc) or time.monotonic() >= give_up_at:
                raise AppendFailedError(subject, exc.code, exc.err_code, exc.description or "") from exc
        await pause(0.5)


async def _service_answers(nc: Client, service: str) -> bool:
    try:
        await nc.request(subjects.query_subject(service, "status"), b"{}", timeout=LIVENESS_TIMEOUT_S)
    except nats.errors.NoRespondersError:
        return False
    except (TimeoutError, nats.errors.TimeoutError):
        return False
    return True


async def stream_last_seq(nc: Client, config: TownConfig) -> int:
    info = await nc.jetstream().stream_info(config.evt_stream)
    return int(info.state.last_seq)


async def first_event_of(
    nc: Client, config: TownConfig, aggregate: str, aggregate_id: str, types: frozenset[str], timeout: float
) -> HistoryEntry | None:
    """The aggregate's first event of one of ``types``, stored already or within ``timeout`` seconds (read from
    the log, like outcomes); None when none came in time."""
    found: asyncio.Future[HistoryEntry] = asyncio.get_running_loop().create_future()

    async def on_msg(msg: Any) -> None:
        entry = history_entry(subjects.parse_js_reply(msg.reply).stream_seq, msg.data)
        if entry.type in types and not found.done():
            found.set_result(entry)

    sub = await nc.jetstream().subscribe(
        subjects.event_subject(aggregate, aggregate_id),
        stream=config.evt_stream,
        cb=on_msg,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    try:
        async with asyncio.timeout(timeout):
            return await found
    except TimeoutError:
        return None
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
