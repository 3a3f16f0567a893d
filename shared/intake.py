"""Command intake: consume a service's commands from GT_CMD and end each in exactly one outcome event.

A command's effects and its outcome (``gt.evt.cmd.<id>``, expected sequence 0) are appended together,
atomically, so a command redelivered after a crash can neither produce a second outcome nor a second
effect: the append fails on the outcome's concurrency check and the intake finds the outcome stored.
Commands on different aggregates are decided concurrently and their appends share group commits;
commands on the same aggregate are decided in order, each on a projection that holds its predecessor.

That order holds across a restart too. JetStream hands a command an instance took and never acknowledged (it
died holding it) to the next one only after the ack wait, long after the commands stored behind it; so a new
instance first settles what its predecessor held, read from the stream in stream order, and only then fetches.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import NamedTuple

import structlog

from shared import ids, subjects
from shared.aio import pause, raise_if_cancelling
from shared.bus import commands as bus_commands
from shared.bus import consumer as bus_consumer
from shared.bus import streams
from shared.bus.append import ERR_MAX_PAYLOAD, Appender, PendingEvent
from shared.bus.commit import GroupCommitter
from shared.bus.connection import Connection
from shared.bus.consumer import CommandConsumer, Message
from shared.bus.errors import BusError
from shared.bus.fencing import fence_error
from shared.bus.kv import Bucket
from shared.bus.reader import EventReader
from shared.bus.topology import origin_cutover
from shared.commands import (
    DEFAULT_MAX_COMMAND_BYTES,
    BeadClaim,
    Command,
    EscalationRaise,
    MergeRequestDone,
    StepDone,
    StepStart,
    peek_body_fields,
    read_command,
)
from shared.decision import Accepted, DecideContext, NewEvent, Route
from shared.errors import (
    STORAGE_FULL_HINT,
    AppendConflictError,
    AppendFailedError,
    AppendTimeoutError,
    CommandError,
    GastownError,
    infrastructure_failure,
)
from shared.events import CommandAccepted, CommandRejected, EventRef, encode_event
from shared.faults import crash_point
from shared.held_attempts import HeldAttempts, HeldRecord
from shared.rate_limit import SERVICE_ACTORS, ActorClass, RateLimiter, actor_class

log = structlog.get_logger(__name__)

Decide = Callable[[Command, DecideContext], Accepted]
Prepare = Callable[[Command], Awaitable[object]]
KeyOf = Callable[[Command], str | None]
RouteOf = Callable[[Command], Route]
MAX_DECIDE_ATTEMPTS = 20
PASS_DELAY_S = 0.2
MAX_PASS_DELAY_S = 5.0
"""A command for another scope goes back to the shared consumer after a delay that grows with its deliveries,
so one for a rig no running witness serves waits in GT_CMD, looked at less and less often, until one does."""
UNSERVED_AFTER_DELIVERIES = 10
"""Deliveries after which a command nobody settled is logged as waiting for an instance of its scope."""
MAX_FAILURES_ENV = "GT_CMD_MAX_DELIVER_CRASHES"
DEFAULT_MAX_FAILURES = 5
"""Attempts at settling one command that failed (its processing raised, or the service died on it) after which
it is set aside: rejected with ``set_aside``, escalated, acknowledged; never retried forever."""
RETRY_FAILED_AFTER_S = 1.0


def max_failures_from_env() -> int:
    """``GT_CMD_MAX_DELIVER_CRASHES`` (at least 1; default ``DEFAULT_MAX_FAILURES``)."""
    raw = os.environ.get(MAX_FAILURES_ENV, "")
    return max(1, int(raw)) if raw.strip().isdigit() else DEFAULT_MAX_FAILURES


OPERATOR = "operator"
"""The actor of a command on a plain subject whose body names none."""
_PLAIN = subjects.command_subject("<aggregate>", "<verb>")
"""How a rejection names a plain command subject."""
POLECAT_PREFIX = "polecat:"
PLUGIN_PREFIX = "plugin:"
SUB_ACTORS: dict[str, tuple[str, ...]] = {"deacon": ("automation:",)}
"""Whom a service may name as a command's actor in its body, besides itself: the deacon runs each automation as
``automation:<name>``. Any other actor in the body of a service's command is refused."""


class Sender(NamedTuple):
    """Who a command is from, as the intake records it, and the class whose rate limits it is charged under: both
    decided by the subject it came on, which the NATS permissions decide who may publish on."""

    actor: str
    cls: ActorClass


def command_actor(
    body_actor: str | None, origin: subjects.Origin | None, *, before_cutover: bool = False
) -> Sender | CommandError:
    """Who a command is from (docs/architecture.md, "Identity"), or the ``unauthorized`` rejection of a body that
    names someone its sender may not act as.

    - On a polecat session's own subject: its polecat (``polecat:<rig>/<polecat>``), whatever its body says; only
      that session may publish there.
    - On a service's own subject (``gt.cmd.<aggregate>.<verb>.svc.<service>``): that service; its body may name
      only what the service acts for (``SUB_ACTORS``: the deacon's ``automation:<name>``).
    - On a plain subject: an operator. The body's ``actor`` labels the operator (``operator``, ``operator:ann``,
      ``supervisor``, ``plugin:<name>``, any free label), but never a service's, an automation's or a polecat's
      name: only operators may publish plain subjects, and the services and sessions never send on them.

    ``before_cutover``: a command on a plain subject stored before this town's services decided the actor by the
    subject (``topology.ORIGIN_CUTOVER_KEY``): settled by the rule it was sent under, its body's actor."""
    if isinstance(origin, subjects.SessionOrigin):
        return Sender(origin.actor, "agent")
    if isinstance(origin, subjects.ServiceOrigin):
        return _service_sender(body_actor, origin)
    if before_cutover:
        actor = body_actor or OPERATOR
        return Sender(actor, actor_class(actor))
    if body_actor is None:
        return Sender(OPERATOR, "operator")
    if body_actor.startswith(PLUGIN_PREFIX):
        # A plugin sending commands with a user that may publish the plain subjects: an operator's label, held to
        # an agent's (smaller) limits as plugins always were. A label can only make its sender more limited.
        return Sender(body_actor, "agent")
    reserved = _reserved(body_actor)
    if reserved is not None:
        return CommandError(
            "unauthorized",
            f"`actor` {body_actor[:80]!r} is {reserved}, and a command on a plain subject "
            f"({_PLAIN}) is an operator's: its `actor` only labels the operator (operator, "
            "operator:<name>, any name that is not a service's or a polecat's). Who acted is decided by the subject "
            "a command came on, never by its body: a polecat session sends on its own subject, a service on "
            f"its own ({_PLAIN}.{subjects.SERVICE_MARK}.<service>), and operators may publish on neither",
        )
    return Sender(body_actor, "operator")


def _reserved(label: str) -> str | None:
    """What ``label`` is reserved for, when it names anyone but an operator (in any case, spaces around it)."""
    name = label.strip().casefold()
    if name.startswith("automation:"):
        return "an automation's name (the deacon runs automations)"
    if name.startswith(POLECAT_PREFIX):
        return "a polecat's name (its sessions send on their own subjects)"
    if actor_class(name) == "service":
        return "a service's name"
    return None


def is_service(name: str) -> bool:
    """A service scope that sends commands: ``mayor``, ``witness`` or one of its scopes (``witness-<rigs>``),
    ``refinery``, ``deacon``."""
    return name in SERVICE_ACTORS or (name.startswith("witness-") and len(name) > len("witness-"))


def _service_sender(body_actor: str | None, origin: subjects.ServiceOrigin) -> Sender | CommandError:
    service = origin.service
    if not is_service(service):
        return CommandError(
            "unauthorized",
            f"{service[:80]!r} is no service of the town: nobody acts as it (its subject is a service's)",
        )
    if body_actor is None or body_actor == service:
        return Sender(service, "service")
    base = service.split("-", 1)[0]
    if any(body_actor.startswith(p) and len(body_actor) > len(p) for p in SUB_ACTORS.get(base, ())):
        return Sender(body_actor, "service")
    allowed = ", ".join(f"{p}<name>" for p in SUB_ACTORS.get(base, ())) or "nobody else"
    return CommandError(
        "unauthorized",
        f"a command on the {service}'s own subject is the {service}'s: its `actor` may name only the {service} "
        f"or what it acts for ({allowed}), not {body_actor[:80]!r}",
    )


def impersonation(cmd: Command, origin: subjects.SessionOrigin) -> CommandError | None:
    """The rejection of a command a polecat session sent in another session's name: a session acts only as
    itself (its ``session`` field, when the command has one, must be the session that sent it)."""
    named = getattr(cmd, "session", None)
    if named is not None and named != origin.session:
        return CommandError(
            "unauthorized",
            f"session {origin.session} (polecat {origin.rig}/{origin.polecat}) may act only as itself, "
            f"not as session {str(named)[:80]!r}",
        )
    bead = worked_bead(cmd)
    if bead is not None and (cmd.fence is None or cmd.fence.lease != ids.hook_lease_name(bead)):
        # The fence is then checked to be held by this very session (fence_error's holder): a session works
        # only the bead it is hooked to.
        return CommandError(
            "unauthorized",
            f"session {origin.session} acts on bead {bead} only with that bead's hook lease as its `fence` "
            f"({ids.hook_lease_name(bead)}): a session works only the bead it holds",
        )
    return None


def worked_bead(cmd: Command) -> str | None:
    """The bead a command works on as its hook holder (its steps, its claim, its merge request)."""
    if isinstance(cmd, StepStart | StepDone | MergeRequestDone):
        return cmd.bead
    if isinstance(cmd, BeadClaim):
        return cmd.id
    return None


class Delivery:
    """One delivery of a stored command: fetched from the consumer (``msg`` set, acked once settled), or read
    from the stream because a dead predecessor held it (``msg`` None: its redelivery is acked later)."""

    __slots__ = (
        "actor",
        "actor_class",
        "body",
        "command_id",
        "command_subject",
        "correlation_id",
        "delivered",
        "held",
        "msg",
        "name",
        "origin",
        "refusal",
        "stored_at",
        "stream_seq",
        "subject",
    )

    def __init__(
        self,
        *,
        subject: str,
        body: bytes,
        headers: dict[str, str] | None,
        stream_seq: int,
        delivered: int,
        max_bytes: int,
        origin_from: int = 0,
        msg: Message | None = None,
        stored_at: datetime | None = None,
    ) -> None:
        self.msg = msg
        self.subject = subject
        self.stream_seq, self.delivered = stream_seq, delivered
        self.held = msg is None
        self.stored_at = stored_at
        self.body = body
        header_id = (headers or {}).get("Nats-Msg-Id")
        if len(self.body) <= max_bytes:
            body_id, actor, correlation = peek_body_fields(self.body)
        else:
            body_id = actor = correlation = None
        self.command_subject, self.origin = subjects.split_origin(subject)
        """The command's own subject (``gt.cmd.step.done``), and who sent it when it came on a session's or a
        service's own subject."""
        self.command_id = ids.command_id(header_id, body_id, self.stream_seq)
        if isinstance(self.origin, subjects.SessionOrigin):
            self.command_id = ids.session_scoped_id(self.origin.session, self.command_id)
        before_cutover = self.origin is None and self.stream_seq < origin_from
        sender = command_actor(actor, self.origin, before_cutover=before_cutover)
        self.refusal: CommandError | None = None
        """The ``unauthorized`` answer of a body naming someone its sender may not act as."""
        if isinstance(sender, CommandError):
            self.refusal = sender
            # Charged as whom the subject says it is from: an operator cannot spend a service's limits.
            sender = Sender(self.origin.actor, "service") if self.origin is not None else Sender(OPERATOR, "operator")
        self.actor, self.actor_class = sender
        self.correlation_id = correlation or self.command_id
        self.name = self.command_subject.removeprefix(subjects.CMD_PREFIX + ".")

    @classmethod
    def fetched(cls, msg: Message, max_bytes: int, origin_from: int) -> Delivery:
        info = subjects.parse_js_reply(msg.reply)
        return cls(
            subject=msg.subject,
            body=msg.data,
            headers=msg.headers,
            stream_seq=info.stream_seq,
            delivered=info.delivered,
            max_bytes=max_bytes,
            origin_from=origin_from,
            msg=msg,
        )

    @classmethod
    def held_by_predecessor(cls, msg: Message, max_bytes: int, origin_from: int) -> Delivery:
        """A command read from the stream (not delivered by the durable consumer): nothing to ack."""
        stored = bus_consumer.stored(msg)
        return cls(
            subject=msg.subject,
            body=msg.data,
            headers=msg.headers,
            stream_seq=stored.seq,
            delivered=0,
            max_bytes=max_bytes,
            origin_from=origin_from,
            stored_at=stored.stored_at,
        )

    def stored_time(self) -> datetime:
        if self.stored_at is not None:
            return self.stored_at
        assert self.msg is not None
        return bus_consumer.stored_at(self.msg)


class CommandIntake:
    """Pulls commands from a durable consumer and settles each one; runs until cancelled."""

    def __init__(
        self,
        *,
        service: str,
        identity: str | None = None,
        nc: Connection,
        stream: str,
        durable: str,
        appender: Appender,
        committer: GroupCommitter,
        reader: EventReader,
        decide: Decide,
        key_of: KeyOf,
        owns: Callable[[str], bool] = lambda _subject: True,
        route: RouteOf | None = None,
        prepare: Prepare | None = None,
        max_in_flight: int = 4_096,
        fetch_batch: int = 512,
        max_command_bytes: int = DEFAULT_MAX_COMMAND_BYTES,
        max_failures: int | None = None,
        held_record: tuple[str, str] | None = None,
        limiter: RateLimiter | None = None,
        new_id: Callable[[str], str] = ids.random_bead_id,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._service = service
        self._identity = identity or service
        """The service scope this instance serves (``witness-east``): the sender of what the intake itself sends."""
        self._nc = nc
        self._stream = stream
        self._durable = durable
        self._consumer = CommandConsumer(nc, stream, durable)
        self._appender = appender
        self._committer = committer
        self._reader = reader
        self._decide = decide
        self._key_of = key_of
        self._owns = owns
        self._route = route
        self._prepare = prepare
        self._max_in_flight = max_in_flight
        self._fetch_batch = fetch_batch
        self._max_bytes = max_command_bytes
        self._max_failures = max_failures if max_failures is not None else max_failures_from_env()
        self._held_record = held_record
        """(KV bucket, key) of the record that pins a command instances died on in their held phase."""
        self._failures: dict[int, int] = {}
        """Stream sequence -> attempts at settling it that raised in this instance."""
        self._infra_failures: dict[int, int] = {}
        """Stream sequence -> deliveries this instance left unsettled because the server failed (not counted
        as the command's failures)."""
        self._limiter = limiter
        self._origin_from = 0
        """The GT_CMD sequence from which commands on plain subjects are an operator's (``origin_cutover``); read
        at start."""
        self._new_id = new_id
        self._clock = clock
        self._slots = asyncio.Semaphore(max_in_flight)
        self._tails: dict[str, asyncio.Task[int]] = {}
        self._tasks: set[asyncio.Task[int]] = set()
        self._in_flight: set[int] = set()
        self._acks: set[asyncio.Task[None]] = set()
        self._committed_high = 0
        self.held_settled = 0
        """Commands a dead predecessor held, settled from the stream before this instance fetched anything."""
        self.processed = 0
        self.rejected = 0
        self.duplicates = 0
        self.passed = 0
        """Deliveries handed back for another scope to settle."""
        self.set_aside = 0
        """Commands set aside after failing ``max_failures`` times (rejected ``set_aside`` and escalated)."""
        self.dropped = 0
        """Commands acknowledged without an outcome: their actor sent them far over its rate limit."""

    # ---- fetching -----------------------------------------------------------------------------

    async def run(self) -> None:
        await self._consumer.bind()
        self._origin_from = await self._read_origin_cutover()
        try:
            await self._settle_held_first()
            while True:
                raise_if_cancelling()
                await self._slots.acquire()
                free = 1
                while free < self._fetch_batch and not self._slots.locked():
                    await self._slots.acquire()
                    free += 1
                try:
                    msgs = await self._consumer.fetch(free)
                except BaseException:
                    for _ in range(free):
                        self._slots.release()
                    raise
                for _ in range(free - len(msgs)):
                    self._slots.release()
                for msg in msgs:
                    self._dispatch(Delivery.fetched(msg, self._max_bytes, self._origin_from))
        finally:
            for task in list(self._tasks):
                task.cancel()
            await self._consumer.close()

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

    # ---- commands a predecessor held ----------------------------------------------------------

    async def _settle_held_first(self) -> None:
        """Dispatch, in stream order, every command the consumer delivered and nobody acked yet; fetches that
        follow queue behind them per aggregate, so a later command never overtakes one a dead instance held.
        Settling one that is in fact still held by a live instance is harmless: its outcome is stored once."""
        started = time.monotonic()
        span = await self._consumer.unacked_span()
        tracker = self._held_attempts()
        record = await tracker.load() if tracker is not None else None
        if span is None:
            if tracker is not None and record is not None:
                await tracker.clear()
            return
        if tracker is not None:
            await tracker.save(record or HeldRecord())
        patterns, next_seq, last = span
        count = 0
        held: list[asyncio.Task[int]] = []
        while next_seq <= last:
            try:
                async with contextlib.aclosing(self._consumer.stored_between(patterns, next_seq, last)) as stored:
                    async for msg in stored:
                        await self._slots.acquire()
                        delivery = Delivery.held_by_predecessor(msg, self._max_bytes, self._origin_from)
                        if tracker is not None and record is not None:
                            task = await self._settle_held_carefully(delivery, tracker, record)
                        else:
                            task = self._dispatch(delivery)
                        if task is not None:
                            held.append(task)
                        next_seq = delivery.stream_seq + 1
                        count += 1
                break
            except (TimeoutError, BusError) as exc:
                log.warning("held_commands_read_failed", consumer=self._durable, at=next_seq, error=repr(exc))
                await pause(0.5)
        log.info("held_commands_dispatched", count=count, upto=last, seconds=round(time.monotonic() - started, 3))
        if tracker is not None:
            forget = asyncio.create_task(_clear_once_settled(held, tracker), name="held-record")
            self._acks.add(forget)
            forget.add_done_callback(self._acks.discard)

    async def _settle_held_carefully(
        self, delivery: Delivery, tracker: HeldAttempts, record: HeldRecord
    ) -> asyncio.Task[int] | None:
        """The previous instance died in its held phase: settle one held command at a time, the record naming
        it first, so that a command instances keep dying on is known, and set aside once named too often."""
        if not self._owns(delivery.subject) or await self._settled_before(delivery):
            return self._dispatch(delivery)  # another's, or its outcome is stored: settling it cannot fail
        deaths = record.deaths.get(delivery.stream_seq, 0)
        if deaths >= self._max_failures:
            await self._escalate_set_aside(delivery, None)
            why = f"{deaths} instances of the {self._service} stopped while settling it"
            return self._dispatch(delivery, override=self._set_aside_error(why))
        record.current = delivery.stream_seq
        await tracker.save(record)
        task = self._dispatch(delivery)
        if task is not None:
            await asyncio.wait({task})
        record.current = None
        return task

    def _held_attempts(self) -> HeldAttempts | None:
        if self._held_record is None:
            return None
        bucket, key = self._held_record
        return HeldAttempts(Bucket(self._nc, bucket), key)

    # ---- dispatch -----------------------------------------------------------------------------

    def _dispatch(self, delivery: Delivery, *, override: CommandError | None = None) -> asyncio.Task[int] | None:
        if not self._owns(delivery.subject):
            # Another service's consumer answers it; this one only makes sure nothing is left unanswered.
            if delivery.msg is not None:
                self._spawn_ack(delivery.msg)
            self._slots.release()
            return None
        if delivery.stream_seq in self._in_flight:
            # Redelivered while the first delivery is still being settled; that one will ack.
            self._slots.release()
            return None
        self._in_flight.add(delivery.stream_seq)
        parsed, key = (override, None) if override is not None else self._read_safely(delivery)
        prev = self._tails.get(key) if key else None
        barrier = self._committed_high
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
        parsed = read_command(delivery.command_subject, delivery.body, max_bytes=self._max_bytes)
        if isinstance(parsed, CommandError):
            return parsed, None
        if (
            isinstance(delivery.origin, subjects.SessionOrigin)
            and (refused := impersonation(parsed, delivery.origin)) is not None
        ):
            return refused, None
        try:
            return parsed, self._key_of(parsed)
        except Exception as exc:
            log.exception("command_key_failed", command_id=delivery.command_id, error=repr(exc))
            return CommandError(
                "invalid", f"the {self._service} could not tell what this command concerns ({exc!r:.200})"
            ), None

    def _done(self, task: asyncio.Task[int], key: str | None, stream_seq: int) -> None:
        self._tasks.discard(task)
        self._in_flight.discard(stream_seq)
        if key and self._tails.get(key) is task:
            del self._tails[key]
        self._slots.release()
        if not task.cancelled() and task.exception() is not None:
            log.error("command_task_failed", error=repr(task.exception()))

    def _spawn_ack(self, msg: Message) -> None:
        task = asyncio.create_task(bus_consumer.ack(msg))
        self._acks.add(task)
        task.add_done_callback(self._acks.discard)

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
        limited = self._rate_limited(delivery, parsed)
        if limited is None:
            await self._drop(delivery)
            return 0
        parsed = limited
        with structlog.contextvars.bound_contextvars(
            command_id=delivery.command_id, command=delivery.name, aggregate=key, cmd_seq=delivery.stream_seq
        ):
            try:
                if self._crashes(delivery) >= self._max_failures and not await self._settled_before(delivery):
                    await self._escalate_set_aside(delivery, None)
                    why = (
                        f"it was delivered {delivery.delivered} times, never settled: the {self._service} stopped on it"
                    )
                    parsed = self._set_aside_error(why)
                if isinstance(parsed, Command):
                    crash_point(f"intake.settle.{delivery.command_id}")  # tests: a service that dies on a command
                seq = await self._settle(delivery, parsed)
            except AppendTimeoutError as exc:
                log.warning("command_outcome_unstored", error=str(exc))
                self._count_infra_failure(delivery)
                return 0  # not acked: redelivered after the ack wait
            except Exception as exc:  # a bug the command triggers: retried a few times, then set aside
                if infrastructure_failure(exc):  # not the command's (GastownError.infrastructure): redelivered
                    self._count_infra_failure(delivery)
                    raise
                seq = await self._after_failure(delivery, exc)
                if not seq:
                    return 0
        self._failures.pop(delivery.stream_seq, None)
        self._infra_failures.pop(delivery.stream_seq, None)
        if delivery.msg is not None:
            await bus_consumer.ack(delivery.msg)
        else:
            # Its redelivery, after the ack wait, finds the outcome stored and acks it.
            self.held_settled += 1
        self.processed += 1
        return seq

    # ---- commands that keep failing --------------------------------------------------------------

    def _crashes(self, delivery: Delivery) -> int:
        """Earlier deliveries of the command that settled nothing and that this instance did not see fail on the
        server: the instances it went to died on it (a crash loop). Not counted where instances hand each
        other's commands back (a routed service: each pass is a delivery too), nor for a command read from the
        stream (its deliveries are unknown there): only failures seen in the process count then."""
        if delivery.msg is None or self._route is not None:
            return 0
        return max(0, delivery.delivered - 1 - self._infra_failures.get(delivery.stream_seq, 0))

    async def _settled_before(self, delivery: Delivery) -> bool:
        return await self._appender.last_on_subject(subjects.outcome_subject(delivery.command_id)) is not None

    def _count_infra_failure(self, delivery: Delivery) -> None:
        self._infra_failures[delivery.stream_seq] = self._infra_failures.get(delivery.stream_seq, 0) + 1

    def _set_aside_error(self, why: str) -> CommandError:
        log.error("command_set_aside", why=why)
        self.set_aside += 1
        return CommandError(
            "set_aside",
            f"the {self._service} set this command aside: {why}. It was not carried out; an escalation was raised. "
            "Fix the command (or report the bug) and send it again under a new id",
        )

    async def _after_failure(self, delivery: Delivery, exc: Exception) -> int:
        """A bug the command triggered while it was processed: retried a few times (the next delivery, soon),
        then set aside. Returns the outcome's sequence once set aside, else 0."""
        failures = self._failures.get(delivery.stream_seq, 0) + 1
        self._failures[delivery.stream_seq] = failures
        log.error("command_failed", error=repr(exc), failures=failures, delivered=delivery.delivered, exc_info=exc)
        if max(failures, self._crashes(delivery) + 1) < self._max_failures:
            if delivery.msg is not None:
                await bus_consumer.nak(delivery.msg, RETRY_FAILED_AFTER_S * failures)
            return 0  # held from a predecessor: its redelivery by the consumer comes after the ack wait
        await self._escalate_set_aside(delivery, exc)
        why = f"settling it failed {failures} times ({type(exc).__name__}: {exc!s:.200})"
        return await self._settle(delivery, self._set_aside_error(why))

    async def _escalate_set_aside(self, delivery: Delivery, exc: Exception | None) -> None:
        """Tell a person (an escalation to the mayor) before the rejection is stored: its id makes a repeat
        harmless, and a rejection stored first could leave the escalation unsent after a crash."""
        what = f"{type(exc).__name__}: {exc!s:.200}" if exc is not None else "the service stopped on it"
        cmd_id = ids.command_id(f"set-aside-{delivery.command_id}", None, 0)
        raise_cmd = EscalationRaise(
            cmd_id=cmd_id,
            severity="high",
            message=f"the {self._service} set command {delivery.command_id} ({delivery.name}) aside: {what}",
            source=self._identity,
        )
        origin = subjects.ServiceOrigin(self._identity)
        try:
            # One attempt: the rejection is stored next either way (a person learns of it there too).
            await bus_commands.store(
                self._nc, self._stream, raise_cmd, evt_stream=self._reader.stream, origin=origin, deadline_s=0
            )
        except (TimeoutError, BusError, GastownError) as exc_pub:
            log.warning("set_aside_escalation_failed", error=repr(exc_pub))

    def _rate_limited(self, delivery: Delivery, parsed: Command | CommandError) -> Command | CommandError | None:
        """The rate-limit step, before deciding: the command as it was, a refusal (``rate_limited``,
        ``too_large``) in its place, or None to drop it without an outcome (docs/operating.md, "Rate limits").
        Charged where it is settled (a command passed on to another scope is not charged by this one), and not
        when a dead predecessor held it: that one charged it. A redelivery whose outcome is stored is answered
        by that outcome all the same (``_settle`` looks for it first)."""
        if self._limiter is None or delivery.held:
            return parsed
        verdict = self._limiter.check(delivery.actor, len(delivery.body), time.monotonic(), cls=delivery.actor_class)
        if verdict.admit:
            return parsed
        if verdict.drop:
            return None
        return CommandError(verdict.code, verdict.message)

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

    async def _settles_here(self, cmd: Command) -> bool:
        """False for a command another scope of this service settles (it goes back to the shared consumer)."""
        if self._route is None:
            return True
        try:
            where = self._route(cmd)
            if where == "unknown":
                # It may name something another instance created a moment ago: judge it on the log as it is now.
                await self._catch_up_with_stream()
                where = self._route(cmd)
        except Exception as exc:  # a bug the command triggers: settled (answered) here, not looped
            log.exception("command_route_failed", error=repr(exc))
            return True
        return where != "elsewhere"

    async def _settle(self, delivery: Delivery, parsed: Command | CommandError) -> int:
        outcome_subject = subjects.outcome_subject(delivery.command_id)
        if delivery.delivered > 1 or delivery.held:
            stored = await self._appender.last_on_subject(outcome_subject)
            if stored is not None:
                self.duplicates += 1
                log.info("command_already_settled", outcome_seq=stored[0])
                return stored[0]
        if isinstance(parsed, Command) and parsed.fence is not None:
            holder = delivery.origin.session if isinstance(delivery.origin, subjects.SessionOrigin) else None
            fenced = await fence_error(
                self._nc, self._reader.stream, parsed.fence, stored_at=delivery.stored_time(), holder=holder
            )
            if fenced is not None:
                parsed = fenced
        facts = await self._prepare(parsed) if self._prepare is not None and isinstance(parsed, Command) else None
        caught_up = False
        for attempt in range(MAX_DECIDE_ATTEMPTS + 1):
            if attempt == MAX_DECIDE_ATTEMPTS:
                parsed = CommandError("conflict", "the aggregate kept changing under the command; send it again")
            pending, rejected = self._events_for(delivery, parsed, facts)
            if rejected == "not_found" and not caught_up and isinstance(parsed, Command):
                # It may name what this service created a moment ago, whose outcome its sender has already
                # read while this projection has not applied it yet: judge it on the log as it is now.
                caught_up = True
                await self._catch_up_with_stream()
                continue
            try:
                seqs = await self._committer.append(pending)
            except ValueError as exc:
                # More events than one atomic append can hold: the command is too big to carry out at once.
                parsed = CommandError("too_large", f"the command would produce too many events at once: {exc}")
                continue
            except AppendConflictError as exc:
                stored = await self._appender.last_on_subject(outcome_subject)
                if stored is not None:
                    self.duplicates += 1
                    log.info("command_already_settled", outcome_seq=stored[0])
                    return stored[0]
                # Someone else moved an aggregate first: decide again on a projection that has it.
                log.info("command_conflict_retry", subject=exc.subject, actual=exc.actual)
                await self._catch_up_with_stream()
                continue
            except AppendFailedError as exc:
                if exc.storage_full:
                    # Not the command's fault: the town is full. It waits in GT_CMD (redelivered, never set aside)
                    # and is carried out once space is back; nothing stored is touched.
                    log.error(
                        "log_storage_full",
                        subject=exc.subject,
                        error=exc.description,
                        err_code=exc.err_code,
                        hint=STORAGE_FULL_HINT,
                    )
                    raise
                if isinstance(parsed, CommandError):
                    raise  # not even the rejection can be stored: leave the command for redelivery
                code = "too_large" if exc.err_code == ERR_MAX_PAYLOAD else "invalid"
                parsed = CommandError(code, f"the log refused the command's events: {exc.description}")
                continue
            self._committed_high = max(self._committed_high, seqs[-1])
            if rejected:
                self.rejected += 1
            return seqs[-1]
        raise AppendTimeoutError(outcome_subject, MAX_DECIDE_ATTEMPTS + 1)

    async def _catch_up_with_stream(self) -> None:
        try:
            last = await streams.last_seq(self._nc, self._reader.stream)
        except (TimeoutError, BusError):
            await pause(0.2)
            return
        with contextlib.suppress(TimeoutError):
            await self._reader.wait_for_seq(last, timeout=10)

    def _events_for(
        self, delivery: Delivery, parsed: Command | CommandError, facts: object = None
    ) -> tuple[list[PendingEvent], str | None]:
        """Decide (again) and encode the command's events followed by its outcome, and the rejection's reason
        code (None when accepted)."""
        now = self._clock()
        accepted: Accepted | None = None
        rejection = parsed if isinstance(parsed, CommandError) else None
        if isinstance(parsed, Command):
            ctx = DecideContext(
                now=now, command_id=delivery.command_id, actor=delivery.actor, new_id=self._new_id, facts=facts
            )
            try:
                accepted = self._decide(parsed, ctx)
            except CommandError as exc:
                rejection = exc
            except Exception as exc:
                log.exception("decide_failed", error=repr(exc))
                rejection = CommandError(
                    "invalid", f"the {self._service} could not process this command ({type(exc).__name__}); see its log"
                )
        pending: list[PendingEvent] = []
        outcome: CommandAccepted | CommandRejected
        if accepted is not None:
            refs: list[EventRef] = []
            for new in accepted.events:
                event = to_pending(
                    new,
                    ts=now,
                    actor=delivery.actor,
                    causation_id=delivery.command_id,
                    correlation_id=delivery.correlation_id,
                )
                pending.append(event)
                refs.append(EventRef(id=event.event_id, type=new.payload.TYPE, subject=event.subject))
            outcome = CommandAccepted(
                command_id=delivery.command_id, command=delivery.name, events=refs, result=accepted.result
            )
        else:
            assert rejection is not None
            log.info("command_rejected", code=rejection.code, reason=rejection.message)
            outcome = CommandRejected(
                command_id=delivery.command_id, command=delivery.name, code=rejection.code, message=rejection.message
            )
        pending.append(
            to_pending(
                NewEvent(payload=outcome, expected_seq=0),  # the first and only outcome of this command
                ts=now,
                actor=self._service,
                causation_id=delivery.command_id,
                correlation_id=delivery.correlation_id,
            )
        )
        return pending, rejection.code if accepted is None and rejection is not None else None


async def _clear_once_settled(held: list[asyncio.Task[int]], tracker: HeldAttempts) -> None:
    """The held phase ended without this instance dying: the next start needs no care."""
    if held:
        await asyncio.wait(held)
    await tracker.clear()


def to_pending(
    new: NewEvent, *, ts: datetime, actor: str, causation_id: str | None, correlation_id: str | None
) -> PendingEvent:
    """A decided event, encoded in its envelope and ready to append to its aggregate's subject."""
    event_id = ids.new_event_id()
    data = encode_event(
        new.payload, event_id=event_id, ts=ts, actor=actor, causation_id=causation_id, correlation_id=correlation_id
    )
    subject = subjects.event_subject(new.payload.AGGREGATE, new.payload.aggregate_id())
    return PendingEvent(subject=subject, data=data, event_id=event_id, expected_seq=new.expected_seq)
