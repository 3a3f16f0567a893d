"""One interface to the mayor for contract tests, with two implementations:

- ``MemoryDriver``: the pure decisions, fold and reconcile over an in-memory log (fast, no I/O);
- ``NatsDriver``: a real mayor on a real nats-server, spoken to through commands and queries only.

The same test runs against both, so the pure model and the running service cannot drift apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client

from services.mayor import queries
from services.mayor.service import MayorService
from services.mayor.state import MayorState
from shared.bus.query import reply_of
from shared.core import ids, subjects
from shared.core.config import TownConfig
from shared.core.errors import CommandError, QueryError
from shared.model.events import decode_envelope
from shared.model.queries import registry
from shared.model.queries.base import Page
from shared.service import ServiceSettings
from shared.service.intake import is_service
from tests.helpers import serving
from tests.log_tools import SEEDED_RIGS, read_all, seed_rigs
from tests.mayor_town import mayor_town
from tests.memory_log import MemoryTown


class Driver(Protocol):
    kind: str

    async def send(self, subject: str, body: dict[str, Any], *, actor: str | None = None) -> dict[str, Any]:
        """Carry out a command; its result, or CommandError with the rejection's code."""

    async def ask(self, what: str, **body: Any) -> Any:
        """A query's result, or QueryError."""

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` of the mayor's time pass and let it reconcile."""


class MemoryDriver:
    kind = "memory"

    def __init__(self, stale_after: timedelta) -> None:
        self.town: MemoryTown[MayorState] = mayor_town(stale_after=stale_after)

    async def send(self, subject: str, body: dict[str, Any], *, actor: str | None = None) -> dict[str, Any]:
        self.town.tick(0.001)
        return self.town.send(subject, body, actor=actor or body.get("actor") or "operator")

    async def ask(self, what: str, **body: Any) -> Any:
        if what in ("formulas", "formula"):
            raise AssertionError("formula queries need the service's catalog; test them on NATS")
        result = queries.answer(self.town.state, registry.decode("mayor", what, body))  # as its query server does
        return read_as_declared(what, body, msgspec.to_builtins(result.items if isinstance(result, Page) else result))

    async def advance(self, seconds: float) -> None:
        self.town.tick(seconds)
        self.town.reconcile()


def read_as_declared(what: str, body: dict[str, Any], result: Any) -> Any:
    """``result`` as the answer carries it (JSON), once it is shown to read into the query's reply type: every
    answer a contract test sees is one a typed client reads (``ask``, the CLI's renderers)."""
    query = registry.decode("mayor", what, body)
    try:
        reply_of(query, result)
    except QueryError as exc:
        raise AssertionError(f"the answer to {query.subject()} does not read as its reply type: {exc}") from None
    return result


class FakeClock:
    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


class NatsDriver:
    kind = "nats"

    def __init__(self, nc: Client, service: MayorService, clock: FakeClock) -> None:
        self.nc = nc
        self.service = service
        self.clock = clock

    async def send(self, subject: str, body: dict[str, Any], *, actor: str | None = None) -> dict[str, Any]:
        cmd_id = f"t-{secrets.token_hex(6)}"
        full = {**body, "cmd_id": cmd_id}
        if actor:
            full["actor"] = actor
        split = subjects.split_command_subject(subject)
        if actor and is_service(actor) and split is not None:
            # A service's command comes on its own subject (a plain one is an operator's, who may not name it).
            subject = subjects.service_command_subject(*split, subjects.ServiceOrigin(actor))
        outcome = await send_and_wait(self.nc, subject, json.dumps(full).encode(), cmd_id)
        if outcome["type"] == "cmd.rejected":
            raise CommandError(outcome["code"], outcome["message"])
        result: dict[str, Any] = outcome["result"]
        return result

    async def ask(self, what: str, **body: Any) -> Any:
        last = int((await self.nc.jetstream().stream_info("GT_EVT")).state.last_seq)
        subject = subjects.query_subject("mayor", what)
        reply = await self.nc.request(subject, json.dumps({**body, "min_seq": last}).encode(), timeout=15)
        answer = json.loads(reply.data)
        if not answer["ok"]:
            raise QueryError(answer["code"], answer["message"])
        return read_as_declared(what, body, answer["result"])

    async def advance(self, seconds: float) -> None:
        self.clock.offset += timedelta(seconds=seconds)
        await self.settle()

    async def settle(self) -> None:
        """Wait until the mayor has applied everything stored and reconciled on it."""
        for _ in range(3):  # a reconcile may store events, which are applied and reconciled in turn
            last = int((await self.nc.jetstream().stream_info("GT_EVT")).state.last_seq)
            assert self.service.reader is not None
            await self.service.reader.wait_for_seq(last, timeout=15)
            await self.service.reconcile()


async def send_and_wait(nc: Client, subject: str, body: bytes, cmd_id: str, *, timeout: float = 30) -> dict[str, Any]:
    """Publish a command as the nats CLI would and return its stored outcome ({"type": ..., **payload})."""
    js = nc.jetstream()
    _command, origin = subjects.split_origin(subject)
    # A session's command is settled in its own namespace (``ids.session_scoped_id``).
    settled_as = ids.session_scoped_id(origin.session, cmd_id) if isinstance(origin, subjects.SessionOrigin) else cmd_id
    outcome_subject = subjects.outcome_subject(settled_as)
    arrived = asyncio.Event()

    async def on_outcome(_msg: Any) -> None:
        arrived.set()

    sub = await nc.subscribe(outcome_subject, cb=on_outcome)
    try:
        await nc.publish(subject, body)
        async with asyncio.timeout(timeout):
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await arrived.wait()
                arrived.clear()
                # A plain subscriber sees the outcome as it is published, a moment before JetStream has
                # stored it (and also when JetStream refused it): the stored outcome is the answer.
                for pause in (0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1):
                    await asyncio.sleep(pause)
                    with contextlib.suppress(nats.js.errors.NotFoundError):
                        msg = await js.get_last_msg("GT_EVT", outcome_subject)
                        env = decode_envelope(msg.data or b"")
                        return {"type": env.type, **json.loads(bytes(env.data))}
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()


@contextlib.asynccontextmanager
async def nats_driver(town: TownConfig, nc: Client) -> AsyncIterator[NatsDriver]:
    clock = FakeClock()
    service = MayorService(town, ServiceSettings(patrol_interval=0.2, idle_heartbeat=0.5), clock=clock)
    async with serving(service, name="mayor"):
        assert service.reader is not None
        await service.reader.wait_for_seq(await seed_rigs(nc, *SEEDED_RIGS), timeout=30)  # as mayor_town() has
        yield NatsDriver(nc, service, clock)


async def events_on(driver: Driver, subject: str) -> list[tuple[str, dict[str, Any]]]:
    """(type, data) of every event the log holds on ``subject``, oldest first, from either driver."""
    if isinstance(driver, MemoryDriver):
        messages = [data for _, subj, data in driver.town.log.messages if subj == subject]
    else:
        assert isinstance(driver, NatsDriver)
        messages = [data for _, _, data in await read_all(driver.nc, "GT_EVT", subject)]
    envelopes = [decode_envelope(data) for data in messages]
    return [(env.type, json.loads(bytes(env.data))) for env in envelopes]
