"""What the CLI does over NATS: send a command and wait for its outcome, ask a query, read a bead's history."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy

from shared import subjects
from shared.bus.reader import parse_ack_reply
from shared.config import TownConfig
from shared.errors import AppendFailedError, QueryError
from shared.events import REGISTRY, EventDecodeError, UnknownEventTypeError, decode_envelope

_JSON = msgspec.json.Encoder()
_DECODE = msgspec.json.Decoder()


class Outcome(msgspec.Struct, kw_only=True):
    command_id: str
    stored_seq: int
    """Sequence of the command in GT_CMD."""
    outcome_seq: int | None = None
    type: str | None = None
    """cmd.accepted or cmd.rejected; None when no outcome arrived in time."""
    data: dict[str, Any] = {}


async def send_command(
    nc: Client, config: TownConfig, subject: str, body: dict[str, Any], *, timeout: float | None
) -> Outcome:
    """Store a command in GT_CMD and wait up to ``timeout`` (None: forever) for its outcome."""
    cmd_id = body.get("cmd_id") or f"cli-{secrets.token_hex(8)}"
    body = {**body, "cmd_id": cmd_id}
    js = nc.jetstream()
    out_subject = subjects.outcome_subject(cmd_id)
    sub = await nc.subscribe(out_subject, max_msgs=1)
    try:
        try:
            ack = await js.publish(
                subject, _JSON.encode(body), stream=config.cmd_stream, headers={"Nats-Msg-Id": cmd_id}, timeout=5
            )
        except nats.js.errors.APIError as exc:
            raise AppendFailedError(subject, exc.code, exc.err_code, exc.description or "") from exc
        outcome = Outcome(command_id=cmd_id, stored_seq=ack.seq)
        try:
            msg = await sub.next_msg(timeout=timeout if timeout is not None else 365 * 24 * 3600)
            _fill(outcome, msg.data, seq=None)
        except nats.errors.TimeoutError:
            # The outcome may have been stored just before we listened; look it up once.
            with contextlib.suppress(nats.js.errors.NotFoundError):
                stored = await js.get_last_msg(config.evt_stream, out_subject)
                _fill(outcome, stored.data or b"", seq=stored.seq)
        return outcome
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()


def _fill(outcome: Outcome, data: bytes, *, seq: int | None) -> None:
    env = decode_envelope(data)
    outcome.type = env.type
    outcome.outcome_seq = seq
    outcome.data = _DECODE.decode(env.data)


async def stream_last_seq(nc: Client, config: TownConfig) -> int:
    info = await nc.jetstream().stream_info(config.evt_stream)
    return int(info.state.last_seq)


async def query(
    nc: Client, service: str, what: str, body: dict[str, Any] | None = None, *, timeout: float = 10.0
) -> Any:
    """Ask ``gt.q.<service>.<what>``; raise QueryError when the service answers with an error."""
    try:
        reply = await nc.request(subjects.query_subject(service, what), _JSON.encode(body or {}), timeout=timeout)
    except nats.errors.NoRespondersError:
        raise QueryError("unavailable", f"the {service} is not running (no one answers {service} queries)") from None
    except nats.errors.TimeoutError:
        raise QueryError("timeout", f"the {service} did not answer within {timeout}s") from None
    answer = _DECODE.decode(reply.data)
    if not answer.get("ok"):
        raise QueryError(answer.get("code", "error"), answer.get("message", "query failed"))
    return answer["result"]


class HistoryEntry(msgspec.Struct, kw_only=True):
    seq: int
    ts: str
    type: str
    actor: str
    causation_id: str | None
    data: dict[str, Any]


async def history(nc: Client, config: TownConfig, aggregate: str, aggregate_id: str) -> list[HistoryEntry]:
    """Every event of one aggregate, straight from the log, in order."""
    js = nc.jetstream()
    subject = subjects.event_subject(aggregate, aggregate_id)
    try:
        last = await js.get_last_msg(config.evt_stream, subject)
    except nats.js.errors.NotFoundError:
        return []
    assert last.seq is not None
    entries: list[HistoryEntry] = []
    done = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        seq, _ = parse_ack_reply(msg.reply)
        try:
            env = decode_envelope(msg.data)
            REGISTRY.decode_payload(env)
            data = _DECODE.decode(env.data)
        except (EventDecodeError, UnknownEventTypeError):
            data = {"undecodable": msg.data[:200].decode("utf-8", "replace")}
            env = None
        entries.append(
            HistoryEntry(
                seq=seq,
                ts=env.ts.isoformat() if env else "",
                type=env.type if env else "?",
                actor=env.actor if env else "?",
                causation_id=env.causation_id if env else None,
                data=data,
            )
        )
        if seq >= last.seq:  # type: ignore[operator]
            done.set()

    sub = await js.subscribe(
        subject, stream=config.evt_stream, cb=on_msg, ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    try:
        await asyncio.wait_for(done.wait(), timeout=30)
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    return entries
