"""Command intake: consume a service's commands from GT_CMD and end each in exactly one outcome event.

The command's effects and its outcome (``gt.evt.cmd.<id>``, expected sequence 0) are appended as one
atomic batch, so a command redelivered after a crash can neither produce a second outcome nor a second
effect: the batch fails on the outcome's concurrency check and the intake finds the outcome stored.
Commands on different aggregates are processed concurrently; commands on the same aggregate in order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any
from datetime import UTC, datetime

import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from shared import ids, subjects
from shared.bus.append import Appender, PendingEvent
from shared.bus.reader import EventReader, parse_ack_reply
from shared.bus.topology import COMMAND_OWNERS
from shared.commands import DEFAULT_MAX_COMMAND_BYTES, Command, parse_command, peek_body_fields
from shared.decision import Accepted, DecideContext
from shared.errors import AppendConflictError, AppendFailedError, AppendTimeoutError, CommandError
from shared.events import CommandAccepted, CommandRejected, EventRef, encode_event

log = structlog.get_logger(__name__)

Decide = Callable[[Command, DecideContext], Accepted]
KeyOf = Callable[[Command], str | None]
MAX_DECIDE_ATTEMPTS = 20


class CommandIntake:
    def __init__(
        self,
        *,
        service: str,
        js: JetStreamContext,
        stream: str,
        durable: str,
        appender: Appender,
        reader: EventReader,
        decide: Decide,
        key_of: KeyOf,
        catch_all: bool = False,
        max_in_flight: int = 2_000,
        fetch_batch: int = 256,
        max_command_bytes: int = DEFAULT_MAX_COMMAND_BYTES,
        new_id: Callable[[str], str] = ids.random_bead_id,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._service = service
        self._js = js
        self._stream = stream
        self._durable = durable
        self._appender = appender
        self._reader = reader
        self._decide = decide
        self._key_of = key_of
        self._catch_all = catch_all
        self._max_in_flight = max_in_flight
        self._fetch_batch = fetch_batch
        self._max_bytes = max_command_bytes
        self._new_id = new_id
        self._clock = clock
        self._slots = asyncio.Semaphore(max_in_flight)
        self._tails: dict[str, asyncio.Task[int | None]] = {}
        self._tasks: set[asyncio.Task[int | None]] = set()
        self._acks: set[asyncio.Task[None]] = set()
        self.processed = 0

    async def run(self) -> None:
        sub = await self._bind()
        try:
            while True:
                await self._slots.acquire()
                free = 1
                while free < self._fetch_batch and not self._slots.locked():
                    await self._slots.acquire()
                    free += 1
                try:
                    msgs = await self._fetch(sub, free)
                except BaseException:
                    for _ in range(free):
                        self._slots.release()
                    raise
                for _ in range(free - len(msgs)):
                    self._slots.release()
                for msg in msgs:
                    self._dispatch(msg)
        finally:
            for task in list(self._tasks):
                task.cancel()
            with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
                await sub.unsubscribe()

    async def _bind(self) -> Any:
        while True:
            try:
                return await self._js.pull_subscribe_bind(self._durable, self._stream)
            except (nats.errors.Error, asyncio.TimeoutError) as exc:
                log.warning("command_consumer_bind_failed", consumer=self._durable, error=repr(exc))
                await asyncio.sleep(0.5)

    async def _fetch(self, sub: Any, n: int) -> list[Msg]:
        try:
            return await sub.fetch(n, timeout=1.0)
        except nats.errors.TimeoutError:
            return []
        except (nats.errors.Error, asyncio.TimeoutError) as exc:
            # Server restarting or leader moving: back off and fetch again; unacked commands are redelivered.
            log.warning("command_fetch_failed", error=repr(exc))
            await asyncio.sleep(0.25)
            return []

    def _dispatch(self, msg: Msg) -> None:
        cmd_seq, _ = parse_ack_reply(msg.reply)
        header_id = (msg.headers or {}).get("Nats-Msg-Id")
        body = msg.data
        verb_of = subjects.split_command_subject(msg.subject)
        if self._catch_all and verb_of is not None:
            owner = COMMAND_OWNERS.get(verb_of[0])
            if owner is not None and owner != self._service:
                self._ack(msg)  # another service's consumer answers it
                self._slots.release()
                return
        body_id, actor, correlation = peek_body_fields(body) if len(body) <= self._max_bytes else (None, None, None)
        command_id = ids.command_id(header_id, body_id, cmd_seq)
        command_name = msg.subject.removeprefix("gt.cmd.")
        parsed: Command | CommandError
        try:
            parsed = parse_command(msg.subject, body, max_bytes=self._max_bytes)
        except CommandError as exc:
            parsed = exc
        key = self._key_of(parsed) if isinstance(parsed, Command) else None
        prev = self._tails.get(key) if key else None
        task = asyncio.create_task(
            self._process(msg, parsed, command_id, command_name, actor or "operator", correlation, prev),
            name=f"cmd-{command_id}",
        )
        self._tasks.add(task)
        if key:
            self._tails[key] = task
        task.add_done_callback(lambda t: self._done(t, key))

    def _done(self, task: asyncio.Task[int | None], key: str | None) -> None:
        self._tasks.discard(task)
        if key and self._tails.get(key) is task:
            del self._tails[key]
        self._slots.release()
        if not task.cancelled() and task.exception() is not None:
            log.error("command_task_failed", error=repr(task.exception()))

    def _ack(self, msg: Msg) -> None:
        async def ack() -> None:
            with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
                await msg.ack()

        task = asyncio.create_task(ack())
        self._acks.add(task)
        task.add_done_callback(self._acks.discard)

    async def _process(
        self,
        msg: Msg,
        parsed: Command | CommandError,
        command_id: str,
        command_name: str,
        actor: str,
        correlation: str | None,
        prev: asyncio.Task[int | None] | None,
    ) -> int | None:
        if prev is not None:
            # Same aggregate: decide on a projection that already holds the previous command's events.
            with contextlib.suppress(Exception):
                prev_seq = await asyncio.shield(prev)
                if prev_seq:
                    await self._reader.wait_for_seq(prev_seq)
        with structlog.contextvars.bound_contextvars(command_id=command_id, command=command_name):
            try:
                seq = await self._settle(parsed, command_id, command_name, actor, correlation)
            except AppendTimeoutError as exc:
                log.warning("command_outcome_unstored", error=str(exc))
                return None  # not acked: redelivered after ack_wait
            self._ack(msg)
            self.processed += 1
            return seq

    async def _settle(
        self, parsed: Command | CommandError, command_id: str, command_name: str, actor: str, correlation: str | None
    ) -> int:
        outcome_subject = subjects.outcome_subject(command_id)
        for _attempt in range(MAX_DECIDE_ATTEMPTS):
            now = self._clock()
            pending: list[PendingEvent] = []
            rejection: CommandError | None = parsed if isinstance(parsed, CommandError) else None
            accepted: Accepted | None = None
            if isinstance(parsed, Command):
                ctx = DecideContext(now=now, command_id=command_id, actor=actor, new_id=self._new_id)
                try:
                    accepted = self._decide(parsed, ctx)
                except CommandError as exc:
                    rejection = exc
            refs: list[EventRef] = []
            if accepted is not None:
                for new in accepted.events:
                    event_id = ids.new_event_id()
                    subject = subjects.event_subject(new.payload.AGGREGATE, new.payload.aggregate_id())
                    data = encode_event(
                        new.payload, event_id=event_id, ts=now, actor=actor,
                        causation_id=command_id, correlation_id=correlation or command_id,
                    )
                    pending.append(PendingEvent(subject=subject, data=data, event_id=event_id, expected_seq=new.expected_seq))
                    refs.append(EventRef(id=event_id, type=new.payload.TYPE, subject=subject))
                outcome: CommandAccepted | CommandRejected = CommandAccepted(
                    command_id=command_id, command=command_name, events=refs, result=accepted.result
                )
                log.debug("command_accepted", events=len(refs))
            else:
                assert rejection is not None
                outcome = CommandRejected(
                    command_id=command_id, command=command_name, code=rejection.code, message=rejection.message
                )
                log.info("command_rejected", code=rejection.code, reason=rejection.message)
            outcome_id = ids.new_event_id()
            pending.append(
                PendingEvent(
                    subject=outcome_subject,
                    data=encode_event(
                        outcome, event_id=outcome_id, ts=now, actor=self._service,
                        causation_id=command_id, correlation_id=correlation or command_id,
                    ),
                    event_id=outcome_id,
                    expected_seq=0,
                )
            )
            try:
                seqs = await self._appender.append(pending)
            except AppendConflictError as exc:
                stored = await self._appender.last_on_subject(outcome_subject)
                if stored is not None:
                    log.info("command_already_settled", outcome_seq=stored[0])
                    return stored[0]
                log.info("command_conflict_retry", subject=exc.subject, actual=exc.actual)
                if exc.actual:
                    with contextlib.suppress(TimeoutError):
                        await self._reader.wait_for_seq(exc.actual, timeout=10)
                continue
            except AppendFailedError as exc:
                if accepted is None:
                    raise
                code = "too_large" if "maximum" in exc.description.lower() or "size" in exc.description.lower() else "invalid"
                parsed = CommandError(code, f"the log refused the command's events: {exc.description}")
                continue
            return seqs[-1]
        parsed = CommandError("conflict", "the aggregate kept changing under the command; retry it")
        return await self._settle(parsed, command_id, command_name, actor, correlation)
