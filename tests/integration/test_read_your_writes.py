"""A command naming something whose event the log already holds is decided on it, even when the service's
projection has not applied that event yet: a `not_found` is decided again once on the log as it is now.

A sender can read the outcome of its first command (the bead created) a moment before the service that stored
it has recorded that it did, or the event can come from another instance; either way the next command must not
be refused `not_found`. Real nats-server and mayor; the mayor's log reader is held back by the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.mayor.service import MayorService
from shared.bus.reader import EventReader
from shared.core.config import TownConfig
from shared.model.decision import NewEvent
from shared.model.events import BeadCreated, decode_envelope
from shared.service import ServiceSettings
from shared.service.intake import to_pending
from tests.helpers import assert_eventually, serving


@pytest.fixture
async def held_mayor(
    town: TownConfig, nc: Client, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[MayorService, asyncio.Event]]:
    """A running mayor whose log reader applies nothing while the returned event is clear."""
    flowing = asyncio.Event()
    flowing.set()
    original = EventReader._make_callback

    def held_back(self: EventReader, generation: int) -> Callable[[Msg], Awaitable[Any]]:
        on_msg = original(self, generation)

        async def when_flowing(msg: Msg) -> None:
            await flowing.wait()
            await on_msg(msg)

        return when_flowing

    monkeypatch.setattr(EventReader, "_make_callback", held_back)
    service = MayorService(town, ServiceSettings(patrol_interval=0.2, idle_heartbeat=0.5))
    async with serving(service, name="mayor"):
        try:
            yield service, flowing
        finally:
            flowing.set()


async def stored_outcome(nc: Client, cmd_id: str) -> dict[str, Any] | None:
    with contextlib.suppress(nats.js.errors.NotFoundError):
        msg = await nc.jetstream().get_last_msg("GT_EVT", f"gt.evt.cmd.{cmd_id}")
        env = decode_envelope(msg.data or b"")
        return {"type": env.type, **json.loads(bytes(env.data))}
    return None


async def test_a_command_on_a_bead_the_projection_has_not_applied_yet_is_not_refused_not_found(
    nc: Client, held_mayor: tuple[MayorService, asyncio.Event]
) -> None:
    service, flowing = held_mayor
    assert service.reader is not None
    js = nc.jetstream()
    flowing.clear()
    # The bead's creation is in the log (written by another instance, or by this one a moment ago)...
    created = to_pending(
        NewEvent(payload=BeadCreated(bead_id="hq-ryw001", title="Just filed"), expected_seq=0),
        ts=datetime.now(UTC),
        actor="mayor",
        causation_id=None,
        correlation_id=None,
    )
    await js.publish(created.subject, created.data, stream="GT_EVT")
    # ...and the next command names it before the mayor's projection has applied it.
    await js.publish(
        "gt.cmd.bead.close",
        json.dumps({"id": "hq-ryw001", "reason": "done", "cmd_id": "ryw-close"}).encode(),
        stream="GT_CMD",
    )

    async def decided_or_waiting() -> tuple[str, dict[str, Any] | None]:
        outcome = await stored_outcome(nc, "ryw-close")
        if outcome is not None:
            return "decided", outcome
        assert isinstance(service.reader, EventReader)
        assert service.reader._waiters, "no outcome yet, and nobody waits for the log"
        return "waiting for the log", None

    first: tuple[str, dict[str, Any] | None] = await assert_eventually(decided_or_waiting, timeout=30, interval=0.05)
    state, early = first
    assert state == "waiting for the log", f"decided on a projection without the bead: {early}"
    flowing.set()

    async def decided() -> dict[str, Any]:
        outcome = await stored_outcome(nc, "ryw-close")
        assert outcome is not None, "not decided yet"
        return outcome

    outcome: dict[str, Any] = await assert_eventually(decided, timeout=30, interval=0.05)
    assert outcome["type"] == "cmd.accepted", outcome
