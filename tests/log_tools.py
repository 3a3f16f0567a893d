"""Reading the real log back in tests: every message, outcomes by command, fresh projections."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy

from services.mayor.projection import new_projection
from shared.core import subjects
from shared.core.subjects import parse_js_reply
from shared.model.events import Envelope, RigAdded, decode_envelope, encode_event
from shared.service.projection import Projection
from tests.helpers import assert_eventually


async def read_all(
    nc: Client, stream: str, subject: str = subjects.EVT_ALL, *, upto: int | None = None
) -> list[tuple[int, str, bytes]]:
    """Every (seq, subject, data) of ``stream`` on ``subject``, up to the last one stored now (or ``upto``)."""
    js = nc.jetstream()
    try:
        last = (await js.get_last_msg(stream, subject)).seq or 0
    except nats.js.errors.NotFoundError:
        return []
    if upto is not None:
        last = min(last, upto)
    out: list[tuple[int, str, bytes]] = []
    done = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        seq = parse_js_reply(msg.reply).stream_seq
        if seq <= last:
            out.append((seq, msg.subject, msg.data))
        if seq >= last:
            done.set()

    sub = await js.subscribe(
        subject,
        stream=stream,
        cb=on_msg,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    try:
        await asyncio.wait_for(done.wait(), 120)
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    return out


async def outcomes(nc: Client, stream: str = "GT_EVT") -> dict[str, list[Envelope]]:
    """Command id -> the outcome events stored for it (there must be exactly one each)."""
    found: dict[str, list[Envelope]] = {}
    for _seq, subject, data in await read_all(nc, stream, subjects.outcome_subject(">")):
        found.setdefault(subjects.outcome_command_id(subject), []).append(decode_envelope(data))
    return found


async def outcome_of(nc: Client, command_id: str, *, stream: str = "GT_EVT", timeout: float = 30.0) -> dict[str, Any]:
    """Wait for the stored outcome of ``command_id``; returns {"type": ..., **payload}."""
    js = nc.jetstream()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            msg = await js.get_last_msg(stream, subjects.outcome_subject(command_id))
        except nats.js.errors.NotFoundError:
            if loop.time() > deadline:
                raise AssertionError(f"no outcome for command {command_id} within {timeout}s") from None
            await asyncio.sleep(0.02)
            continue
        env = decode_envelope(msg.data or b"")
        payload: dict[str, Any] = msgspec.json.decode(env.data)
        return {"type": env.type, "seq": msg.seq, **payload}


async def fresh_replay(
    nc: Client, projection: Projection[Any], stream: str = "GT_EVT", *, upto: int | None = None
) -> Projection[Any]:
    """Fold the log (up to ``upto``) into a new, empty projection."""
    for seq, subject, data in await read_all(nc, stream, upto=upto):
        projection.apply(seq, subject, data)
    return projection


def digest(projection: Projection[Any]) -> str:
    return hashlib.sha256(projection.serialize_state()).hexdigest()


async def assert_live_mayor_matches_replay(nc: Client, min_seq: int, timeout: float = 120) -> Projection[Any]:
    """The running mayor's projection, once it holds ``min_seq`` (asked until it answers, within ``timeout``: it
    may be restarting), equals a fresh replay of the same log prefix. The replay, for more checks."""

    async def answered() -> dict[str, Any]:
        try:
            reply = await nc.request("gt.q.mayor.digest", json.dumps({"min_seq": min_seq}).encode(), timeout=10)
        except (TimeoutError, nats.errors.Error) as exc:
            raise AssertionError(f"the mayor does not answer its digest query: {exc!r}") from exc
        answer: dict[str, Any] = json.loads(reply.data)
        assert answer.get("ok"), answer
        result: dict[str, Any] = answer["result"]
        return result

    live: dict[str, Any] = await assert_eventually(answered, timeout=timeout, interval=0.5)
    replayed = await fresh_replay(nc, new_projection(), upto=live["last_seq"])
    assert live["sha256"] == digest(replayed)
    return replayed


async def events_of(nc: Client, subject: str) -> list[tuple[str, dict[str, Any]]]:
    """(type, payload) of every event stored on ``subject`` (one aggregate's, e.g. ``gt.evt.mr.<id>``)."""
    out = []
    for _seq, _subject, data in await read_all(nc, "GT_EVT", subject):
        env = decode_envelope(data)
        out.append((env.type, msgspec.json.decode(env.data)))
    return out


SEEDED_RIGS = ("demo", "web")
"""Rigs a mayor-only test town starts with (no witness adds them there): slings to them are accepted."""


async def seed_rigs(nc: Client, *names: str) -> int:
    """Store ``rig.added`` for each of ``names`` as the witness would (once: a rig already there is left as it
    is); the last sequence stored."""
    js = nc.jetstream()
    last = 0
    for name in names:
        event = RigAdded(rig=name, repo=f"/repos/{name}.git", prefix=name[:16], agent_command="gt-agent")
        data = encode_event(event, event_id=f"seed-rig-{name}", ts=datetime.now(UTC), actor=f"witness/{name}")
        with contextlib.suppress(nats.js.errors.APIError):  # wrong last sequence: it is there already
            subject = subjects.event_subject("rig", name)
            ack = await js.publish(subject, data, headers={"Nats-Expected-Last-Subject-Sequence": "0"})
            last = max(last, ack.seq)
    return last
