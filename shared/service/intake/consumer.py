"""Command intake: consume a service's commands from GT_CMD and end each in exactly one outcome event.

A command's effects and its outcome (``gt.evt.cmd.<id>``, expected sequence 0) are appended together,
atomically, so a command redelivered after a crash can neither produce a second outcome nor a second
effect: the append fails on the outcome's concurrency check and the intake finds the outcome stored
(``settle``). Commands on different aggregates are decided concurrently and their appends share group commits;
commands on the same aggregate (``Command.ordering_key``) are decided in order, each on a projection that holds
its predecessor. That order holds across a restart too (``held``).

This module fetches, dispatches and orders; who sent a command is ``identity``/``delivery``, charging it
``rate_limit``, settling it ``settle``, a command that keeps failing ``poison``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog

from shared.bus import consumer as bus_consumer
from shared.bus import streams
from shared.bus.append import Appender
from shared.bus.commit import GroupCommitter
from shared.bus.connection import Connection
from shared.bus.consumer import CommandConsumer
from shared.bus.errors import BusError
from shared.bus.kv import Bucket
from shared.bus.topology import origin_cutover, owner_of
from shared.core import subjects
from shared.core.aio import pause, raise_if_cancelling
from shared.core.errors import AppendTimeoutError, CommandError, infrastructure_failure
from shared.core.faults import crash_point
from shared.model.commands import DEFAULT_MAX_COMMAND_BYTES, Command, read_command
from shared.service.follower import Follower
from shared.service.intake import rate_limit
from shared.service.intake.delivery import Delivery
from shared.service.intake.handler import CommandHandler
from shared.service.intake.held import HeldAttempts, HeldPhase
from shared.service.intake.identity import impersonation
from shared.service.intake.poison import Poison, max_failures_from_env
from shared.service.intake.settle import Settler

log = structlog.get_logger(__name__)

PASS_DELAY_S = 0.2
MAX_PASS_DELAY_S = 5.0
"""A command for another scope goes back to the shared consumer after a delay that grows with its deliveries,
so one for a rig no running witness serves waits in GT_CMD, looked at less and less often, until one does."""
UNSERVED_AFTER_DELIVERIES = 10
"""Deliveries after which a command nobody settled is logged as waiting for an instance of its scope."""


class CommandIntake:
    """Pulls commands from a durable consumer and settles each one; runs until cancelled."""

    def __init__(
        self,
        *,
        service: str,
        handler: CommandHandler,
        identity: str | None = None,
        nc: Connection,
        stream: str,
        durable: str,
        appender: Appender,
        committer: GroupCommitter,
        reader: Follower,
        max_in_flight: int = 4_096,
        fetch_batch: int = 512,
        max_command_bytes: int = DEFAULT_MAX_COMMAND_BYTES,
        max_failures: int | None = None,
        held_record: tuple[str, str] | None = None,
        limiter: rate_limit.RateLimiter | None = None,
    ) -> None:
        self.service = service
        self._handler = handler
        self._identity = identity or service
        """The service scope this instance serves (``witness-east``): the sender of what the intake itself sends."""
        self._nc = nc
        self._stream = stream
        self.durable = durable
        self.consumer = CommandConsumer(nc, stream, durable)
        self._reader = reader
        self._fetch_batch = fetch_batch
        self.max_bytes = max_command_bytes
        self._held_record = held_record
        """(KV bucket, key) of the record that pins a command instances died on in their held phase."""
        self._limiter = limiter
        self.origin_from = 0
        """The GT_CMD sequence from which commands on plain subjects are an operator's (``origin_cutover``); read
        at start."""
        self.settler = Settler(
            service=service, handler=handler, nc=nc, appender=appender, committer=committer, reader=reader
        )
        self.poison = Poison(
            service=service,
            identity=self._identity,
            nc=nc,
            stream=stream,
            evt_stream=reader.stream,
            max_failures=max_failures if max_failures is not None else max_failures_from_env(),
            counts_deliveries=not handler.routes_commands,
        )
        self.slots = asyncio.Semaphore(max_in_flight)
        self._tails: dict[str, asyncio.Task[int]] = {}
        self._tasks: set[asyncio.Task[int]] = set()
        self._in_flight: set[int] = set()
        self._acks: set[asyncio.Task[None]] = set()
        self.held_settled = 0
        """Commands a dead predecessor held, settled from the stream before this instance fetched anything."""
        self.processed = 0
        self.passed = 0
        """Deliveries handed back for another scope to settle."""
        self.dropped = 0
        """Commands acknowledged without an outcome: their actor sent them far over its rate limit."""

    @property
    def rejected(self) -> int:
        return self.settler.rejected

    @property
    def duplicates(self) -> int:
        return self.settler.duplicates

    @property
    def set_aside(self) -> int:
        """Commands set aside after failing ``max_failures`` times (rejected ``set_aside`` and escalated)."""
        return self.poison.set_aside

    def owns(self, subject: str) -> bool:
        """Whether this service answers commands on ``subject`` (the catch-all mayor reads the others' too)."""
        return owner_of(subject) == self.service

    def keep(self, task: asyncio.Task[None]) -> None:
        """Hold a background task until it ends."""
        self._acks.add(task)
        task.add_done_callback(self._acks.discard)

    # ---- fetching -----------------------------------------------------------------------------

    async def run(self) -> None:
        await self.consumer.bind()
        self.origin_from = await self._read_origin_cutover()
        try:
            await HeldPhase(self, self._held_attempts()).run()
            while True:
                raise_if_cancelling()
                # One command, dispatched as soon as it comes; then those already waiting behind it, as many as
                # there are free slots (a fetch of many would hold the first until all came or a second passed).
                if await self._fetch(1, bus_consumer.FETCH_WAIT_S) and self._fetch_batch > 1:
                    await self._fetch(self._fetch_batch - 1, bus_consumer.DRAIN_WAIT_S)
        finally:
            for task in list(self._tasks):
                task.cancel()
            await self.consumer.close()

    async def _fetch(self, most: int, wait_s: float) -> int:
        """Fetch and dispatch up to ``most`` commands, one slot each (at least one slot is waited for), waiting up
        to ``wait_s`` for them; how many came."""
        await self.slots.acquire()
        free = 1
        while free < most and not self.slots.locked():
            await self.slots.acquire()
            free += 1
        try:
            msgs = await self.consumer.fetch(free, wait_s=wait_s)
        except BaseException:
            for _ in range(free):
                self.slots.release()
            raise
        for _ in range(free - len(msgs)):
            self.slots.release()
        for msg in msgs:
            self.dispatch(Delivery.fetched(msg, self.max_bytes, self.origin_from))
        return len(msgs)

    async def _read_origin_cutover(self) -> int:
        while True:
            raise_if_cancelling()
            try:
                state = await streams.state(self._nc, self._stream)
            except (TimeoutError, BusError) as exc:
                log.warning("command_stream_info_failed", stream=self._stream, error=repr(exc))
                await pause(0.5)
                continue
            return origin_cutover(state.metadata)

    def _held_attempts(self) -> HeldAttempts | None:
        if self._held_record is None:
            return None
        bucket, key = self._held_record
        return HeldAttempts(Bucket(self._nc, bucket), key)

    # ---- dispatch -----------------------------------------------------------------------------

    def dispatch(self, delivery: Delivery, *, override: CommandError | None = None) -> asyncio.Task[int] | None:
        """Start settling a delivery, behind the commands before it with the same ordering key; holds one slot
        until it is settled. None: nothing to settle here (another service's, or already being settled)."""
        if not self.owns(delivery.subject):
            # Another service's consumer answers it; this one only makes sure nothing is left unanswered.
            if delivery.msg is not None:
                self.keep(asyncio.create_task(bus_consumer.ack(delivery.msg)))
            self.slots.release()
            return None
        if delivery.stream_seq in self._in_flight:
            # Redelivered while the first delivery is still being settled; that one will ack.
            self.slots.release()
            return None
        self._in_flight.add(delivery.stream_seq)
        parsed, key = (override, None) if override is not None else self._read_safely(delivery)
        prev = self._tails.get(key) if key else None
        barrier = self.settler.committed_high
        task = asyncio.create_task(
            self._process(delivery, parsed, key, prev, barrier), name=f"cmd-{delivery.command_id}"
        )
        self._tasks.add(task)
        if key:
            self._tails[key] = task
        task.add_done_callback(lambda t: self._done(t, key, delivery.stream_seq))
        return task

    def _read_safely(self, delivery: Delivery) -> tuple[Command | CommandError, str | None]:
        """The command a delivery carries and the aggregate it is decided on, or the rejection that answers it.
        Nothing a body holds may raise out of here: an exception would end the intake loop, the command would
        stay in GT_CMD, and the service would die on it again at every restart."""
        if delivery.refusal is not None:
            return delivery.refusal, None  # who sent it is checked before what it says
        parsed = read_command(delivery.command_subject, delivery.body, max_bytes=self.max_bytes)
        if isinstance(parsed, CommandError):
            return parsed, None
        if (
            isinstance(delivery.origin, subjects.SessionOrigin)
            and (refused := impersonation(parsed, delivery.origin)) is not None
        ):
            return refused, None
        try:
            return parsed, parsed.ordering_key()
        except Exception as exc:
            log.exception("command_key_failed", command_id=delivery.command_id, error=repr(exc))
            return CommandError(
                "invalid", f"the {self.service} could not tell what this command concerns ({exc!r:.200})"
            ), None

    def _done(self, task: asyncio.Task[int], key: str | None, stream_seq: int) -> None:
        self._tasks.discard(task)
        self._in_flight.discard(stream_seq)
        if key and self._tails.get(key) is task:
            del self._tails[key]
        self.slots.release()
        if not task.cancelled() and task.exception() is not None:
            log.error("command_task_failed", error=repr(task.exception()))

    # ---- settling -----------------------------------------------------------------------------

    async def _process(
        self,
        delivery: Delivery,
        parsed: Command | CommandError,
        key: str | None,
        prev: asyncio.Task[int] | None,
        barrier: int,
    ) -> int:
        """Settle one command; returns the sequence of its outcome (0 when it could not be stored yet)."""
        if prev is not None:
            # Same aggregate: decide on a projection that holds the previous command's events.
            with contextlib.suppress(Exception):
                barrier = max(barrier, await asyncio.shield(prev))
        if barrier:
            # Read-your-writes for deciding: every outcome this service already reported is applied.
            await self._reader.wait_for_seq(barrier)
        if isinstance(parsed, Command) and not await self._settles_here(parsed):
            return await self._pass(delivery)
        limited = rate_limit.admit(self._limiter, delivery, parsed, time.monotonic())
        if limited is None:
            await self._drop(delivery)
            return 0
        parsed = limited
        poison = self.poison
        with structlog.contextvars.bound_contextvars(
            command_id=delivery.command_id, command=delivery.name, aggregate=key, cmd_seq=delivery.stream_seq
        ):
            try:
                if poison.crashes(delivery) >= poison.max_failures and not await self.settler.settled_before(delivery):
                    await poison.escalate(delivery, None)
                    why = (
                        f"it was delivered {delivery.delivered} times, never settled: the {self.service} stopped on it"
                    )
                    parsed = poison.set_aside_error(why)
                if isinstance(parsed, Command):
                    crash_point(f"intake.settle.{delivery.command_id}")  # tests: a service that dies on a command
                seq = await self.settler.settle(delivery, parsed)
            except AppendTimeoutError as exc:
                log.warning("command_outcome_unstored", error=str(exc))
                poison.count_infra_failure(delivery)
                return 0  # not acked: redelivered after the ack wait
            except Exception as exc:  # a bug the command triggers: retried a few times, then set aside
                if infrastructure_failure(exc):  # not the command's (GastownError.infrastructure): redelivered
                    poison.count_infra_failure(delivery)
                    raise
                set_aside = await poison.after_failure(delivery, exc)
                if set_aside is None:
                    return 0
                seq = await self.settler.settle(delivery, set_aside)
                if not seq:
                    return 0
        poison.forget(delivery)
        if delivery.msg is not None:
            await bus_consumer.ack(delivery.msg)
        else:
            # Its redelivery, after the ack wait, finds the outcome stored and acks it.
            self.held_settled += 1
        self.processed += 1
        return seq

    async def _settles_here(self, cmd: Command) -> bool:
        """False for a command another scope of this service settles (it goes back to the shared consumer)."""
        if not self._handler.routes_commands:
            return True
        try:
            where = self._handler.route(cmd)
            if where == "unknown":
                # It may name something another instance created a moment ago: judge it on the log as it is now.
                await self.settler.catch_up()
                where = self._handler.route(cmd)
        except Exception as exc:  # a bug the command triggers: settled (answered) here, not looped
            log.exception("command_route_failed", error=repr(exc))
            return True
        return where != "elsewhere"

    async def _pass(self, delivery: Delivery) -> int:
        """Hand a delivery back for the scope that settles it."""
        if delivery.msg is None:
            return 0  # another scope's, held by its own instance: that one (or its successor) settles it
        log.debug("command_passed", command_id=delivery.command_id, delivered=delivery.delivered)
        if delivery.delivered == UNSERVED_AFTER_DELIVERIES:
            log.warning(
                "command_waits_for_its_scope",
                command_id=delivery.command_id,
                command=delivery.name,
                delivered=delivery.delivered,
                hint="no running instance of this service serves what it concerns; it waits in GT_CMD",
            )
        await bus_consumer.nak(delivery.msg, min(MAX_PASS_DELAY_S, PASS_DELAY_S * delivery.delivered))
        self.passed += 1
        return 0

    async def _drop(self, delivery: Delivery) -> None:
        if delivery.msg is not None:
            await bus_consumer.ack(delivery.msg)
        self.dropped += 1
        if self.dropped % 1_000 == 1:
            log.warning(
                "commands_dropped_over_rate_limit",
                actor=delivery.actor,
                command=delivery.name,
                command_id=delivery.command_id,
                dropped=self.dropped,
            )
