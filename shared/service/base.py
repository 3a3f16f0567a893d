"""The service base: connect, rebuild the projection (snapshot + tail), act only once caught up and active.

Several instances of one service scope may run (``shared.model.activity``): each follows the log and answers queries,
but only the one holding the scope's key in ``GT_ACTIVE`` takes commands, reconciles and writes events; the
others stand by and take over when the key lapses. Every write first checks that this instance may still act.

The base composes components with one job each (docs/architecture.md, "One service"): the run skeleton
(``lifecycle.Lifecycle``, shared with the plugin SDK), the ``SnapshotKeeper``, the ``HeartbeatSender`` and the
``QueryServer``; the bus's reader, appender, activity keeper and the command intake.

``run()`` blocks until ``shutdown()`` or a fatal error, which it re-raises (``ActivityLostError`` when another
instance took over). ``shutdown()`` is idempotent and safe before ``run()``. Every loop lives in one TaskGroup;
cancellation is never swallowed.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar, Generic, TypeVar

import msgspec
import structlog

from shared.bus import commands as bus_commands
from shared.bus import streams
from shared.bus.activity_kv import ActivityKeeper
from shared.bus.append import Appender
from shared.bus.commit import GroupCommitter
from shared.bus.connection import Connection
from shared.bus.direct_reader import DirectReader
from shared.bus.reader import EventReader
from shared.bus.snapshots import SnapshotStore
from shared.bus.topology import command_consumer_name, has_command_consumer, missing_for_services, provision
from shared.core import ids, subjects
from shared.core import logging as gt_logging
from shared.core.aio import pause, raise_if_cancelling, wait_event
from shared.core.config import TownConfig
from shared.core.errors import ActivityLostError, AppendConflictError, QueryError, retryable
from shared.model import heartbeats
from shared.model.commands import Command
from shared.model.decision import Accepted, DecideContext, NewEvent, Route
from shared.model.queries.base import Query, ServiceStatus
from shared.service import heap as runtime
from shared.service.follower import Follower
from shared.service.heartbeat import HeartbeatSender
from shared.service.intake import CommandIntake, rate_limit, to_pending
from shared.service.intake.rate_limit import RateLimiter
from shared.service.lifecycle import Lifecycle
from shared.service.projection import Projection
from shared.service.queries import QueryServer
from shared.service.settings import ServiceSettings
from shared.service.snapshots import SnapshotKeeper

log = structlog.get_logger(__name__)

S = TypeVar("S", bound=msgspec.Struct)


class Service(Generic[S]):
    """Base of mayor, witness, refinery and deacon. Subclasses set ``name`` and override the hooks."""

    name: ClassVar[str] = "service"
    tick_failed: ClassVar[str] = "tick_failed"
    """The log event of a failed ``tick``."""
    provisions: ClassVar[bool] = True
    """It makes the town's streams and buckets at start when they are missing (``topology.provision``). One whose
    NATS user may not (a gate runner) waits until another service has made them."""
    reads_only: ClassVar[str | None] = None
    """None: it follows the whole log with a consumer of its own (``EventReader``). A subject filter: it reads only
    the events there, by batched direct gets (``DirectReader``), as a user with no JetStream of its own may (a gate
    runner, in account RUNNERS); it then keeps no snapshot (the object store is not its to write)."""

    def __init__(
        self,
        config: TownConfig,
        projection: Projection[S],
        settings: ServiceSettings | None = None,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.config = config
        self.clock = clock
        """Where the service reads the time: decisions and the events it stores are stamped with it."""
        self.projection = projection
        self.settings = settings or ServiceSettings()
        self.limiter = RateLimiter(rate_limit.load())
        """Per-actor rate limits of the command intake (``GT_RATE_*``), read once at start."""
        self.nc: Connection | None = None
        self.reader: Follower | None = None
        self.appender: Appender | None = None
        self.committer: GroupCommitter | None = None
        self.intake: CommandIntake | None = None
        self.snapshots: SnapshotKeeper | None = None
        """The projection's snapshots (set once connected)."""
        self.ready = asyncio.Event()
        """Set once caught up with the log and serving."""
        self.lifecycle = Lifecycle(
            config, label=self.name, client_name=f"gt-{self.name}", log_context={"service": self.name}
        )
        """The run skeleton: ``run()`` and ``shutdown()`` are its."""
        self.queries = QueryServer(self)
        """Answers ``gt.q.<name>.*`` once following the log, by a standby too."""
        self.heartbeats = HeartbeatSender(config.service_bucket, self.settings.heartbeat_interval, self._heartbeat)
        """This instance's heartbeat in ``GT_SERVICES``."""
        self._dirty = asyncio.Event()
        self._urgent = asyncio.Event()
        """Set with ``_dirty`` when the next reconcile must not wait for ``reconcile_gap_s``."""
        self._started_at = time.monotonic()
        self.instance = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        """This process of the service, as its heartbeats name it."""
        self.activity: ActivityKeeper | None = None
        """This instance's side of its scope's activity key (set once connected)."""
        self.following = asyncio.Event()
        """Set once caught up with the log: queries are answered from then on, by a standby too."""
        self._started_wall = datetime.now(UTC)
        self.reconcile_errors = 0
        self.tick_errors = 0
        self.reconciles = 0
        self.patrol_last_s = 0.0
        self.patrol_max_s = 0.0
        self.patrol_total_s = 0.0
        """How long ``reconcile`` took: the last patrol, the longest, and all of them (for the metrics plugin)."""
        """Reconcile passes finished (tests wait for "at least one more pass" with it)."""

    @property
    def identity(self) -> str:
        """The service scope this instance serves: its activity key and its name in heartbeats and liveness
        (``witness-east`` for a witness of some rigs; the service's name otherwise)."""
        return self.name

    @property
    def query_scope(self) -> str:
        """Whose queries it answers, ``gt.q.<query_scope>.*``: the service's name (any instance of it answers, a
        scope's or a standby); a gate runner's own scope (each runner is asked on its own)."""
        return self.name

    @property
    def queries_refused(self) -> int:
        """Queries not answered: their reply subject was no inbox (``subjects.is_inbox``)."""
        return self.queries.refused

    @property
    def role(self) -> str:
        """starting (replaying), standby, active, or lost (it must stop acting)."""
        return self.activity.role if self.activity is not None else "starting"

    async def wait_active(self) -> None:
        """Return once this instance may act (at once, unless it is paused because its activity key could not
        be renewed); raise ``ActivityLostError`` when it may not act again. Awaited before anything is written."""
        if self.activity is None:
            raise ActivityLostError(self.identity, "not connected yet")
        await self.activity.wait_active()

    # ---- hooks --------------------------------------------------------------------------------

    async def reconcile(self) -> None:
        """Carry out the actions still owed: called after catch-up, after applied events, on each patrol tick."""

    def start_background(self, tg: asyncio.TaskGroup) -> None:
        """Start the service's own loops in the service's task group, once caught up (before the first reconcile)."""

    def start_following(self, tg: asyncio.TaskGroup) -> None:
        """Start what the service's answers read besides its projection, in the service's task group, once caught up
        with the log: queries are answered from then on, by a standby too."""

    async def before_release(self) -> None:
        """Wait for what threads of the service's own still do where a standby taking over would act (its acting
        tasks have ended): called before the activity key is released on a clean stop."""

    def tick_s(self) -> float:
        """Seconds between the service's own ticks (``tick``), a clock of their own beside the patrol's; 0: none."""
        return 0.0

    async def tick(self) -> None:
        """One pass of the service's periodic work that must not wait for the patrol (the deacon's watch), run
        every ``tick_s`` while this instance may act. A failed pass is logged and counted; the next looks again."""

    def wake(self) -> None:
        """Reconcile again soon (something observed changed, or an action finished)."""
        self._dirty.set()

    def reconcile_gap_s(self) -> float:
        """The least time between the end of one reconcile and the start of the next that events asked for (a
        patrol tick waits longer anyway): none here; a service whose reconcile observes much says more."""
        return 0.0

    def wake_now(self) -> None:
        """Reconcile again at once, without ``reconcile_gap_s`` (a process died: recovery waits for nothing)."""
        self._urgent.set()
        self._dirty.set()

    async def store(self, cmd: Command) -> bus_commands.StoredCommand:
        """Store a command for another service in GT_CMD (its outcome comes later, in the log), once this instance
        may act; returns its GT_CMD sequence and the id it is settled under. Its ``cmd_id`` (required) makes it
        idempotent: the same id is carried out once, so a resend after a crash is harmless (another id only when
        some other sender took this one first: ``bus_commands.store``).

        It is sent on this service's own subject (``gt.cmd.bead.close.svc.refinery``), which is what makes it this
        service's: the intake records its actor from there, never from the body (whose ``actor`` may only name what
        the service acts for, the deacon's ``automation:<name>``). Resent while the stream is unreachable, for as
        long as it takes; a refusal by the server's permissions (a deployment error) is raised, not retried."""
        assert self.nc is not None
        return await bus_commands.store(
            self.nc,
            self.config.cmd_stream,
            cmd,
            evt_stream=self.config.evt_stream,
            origin=subjects.ServiceOrigin(self.identity),
            deadline_s=None,
            before_attempt=self.wait_active,
        )

    async def append_owed(self, owed: list[NewEvent], *, causation_id: str | None = None) -> int:
        """Store events the service decided by itself (in ``reconcile``), each on its own, and wait until
        they are applied. Each carries its aggregate's expected sequence: one whose aggregate moved in the
        meantime is dropped, and the next reconcile decides again on the newer state. Returns how many
        were stored."""
        assert self.committer is not None
        assert self.reader is not None
        await self.wait_active()
        now = self.clock()
        appends = [
            self.committer.append(
                [to_pending(new, ts=now, actor=self.name, causation_id=causation_id, correlation_id=None)]
            )
            for new in owed
        ]
        results = await asyncio.gather(*appends, return_exceptions=True)
        stored = [r[-1] for r in results if isinstance(r, list)]
        for new, outcome in zip(owed, results, strict=True):
            if isinstance(outcome, AppendConflictError):
                log.debug("owed_event_superseded", type=new.payload.TYPE, aggregate=new.payload.aggregate_id())
            elif isinstance(outcome, BaseException):
                if isinstance(outcome, asyncio.CancelledError | ActivityLostError):
                    raise outcome
                log.warning("owed_event_not_stored", type=new.payload.TYPE, error=repr(outcome))
        if stored:
            await self.reader.wait_for_seq(max(stored))
        return len(stored)

    def decide(self, cmd: Command, ctx: DecideContext) -> Accepted:
        """Turn a command into events, or raise ``CommandError``. Pure: reads only the projection."""
        raise NotImplementedError

    async def prepare(self, cmd: Command) -> object:
        """Observe what deciding ``cmd`` needs from outside the log (I/O allowed); ``DecideContext.facts``."""
        return None

    def route(self, cmd: Command) -> Route:
        """Which scope settles ``cmd`` when several instances with disjoint scopes share the command consumer."""
        return "mine"

    @property
    def routes_commands(self) -> bool:
        """Only a service whose instances hand each other commands routes them (the witness, overriding
        ``route``); the others' deliveries all count towards setting aside a command a service keeps dying on."""
        return type(self).route is not Service.route

    def now(self) -> datetime:
        """The time a decision is taken at (``clock``)."""
        return self.clock()

    def new_id(self, prefix: str) -> str:
        """A fresh id for what a command creates when its sender chose none."""
        return ids.random_bead_id(prefix)

    def query(self, query: Query[Any]) -> Any:
        """Answer ``query`` (``gt.q.<name>.<NAME>``, decoded into its class) from the projection, with ``match``."""
        raise QueryError("unknown_query", f"{self.name} has no query {query.NAME!r}")

    def query_for_session(self, query: Query[Any], session: str) -> Any:
        """Answer ``query`` asked from polecat session ``session``'s private inbox (after ``check_session_query``):
        a service whose lists hold one session's or polecat's own things leaves out the others' here. Everything
        else is answered as ``query`` answers it."""
        return self.query(query)

    def check_session_query(self, query: Query[Any], session: str) -> None:
        """Refuse (``QueryError`` ``unauthorized``) what polecat session ``session`` may not ask about: called for
        a query whose reply goes to a session's private inbox, which only that session may read (its NATS
        identity subscribes nowhere else). A service whose answers hold one session's or polecat's own things
        (mail, nudges) overrides it; everything else is the town's, readable by every session."""

    # ---- lifecycle ----------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Ask ``run()`` to stop; returns at once. Safe to call any number of times, also before ``run()``."""
        self.lifecycle.shutdown()

    async def __aenter__(self) -> Service[S]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def run(self) -> None:
        """Serve until ``shutdown()``; re-raises the error that made the service stop otherwise."""
        await self.lifecycle.run(self._run_connected)

    async def _run_connected(self, nc: Connection) -> None:
        self.nc = nc
        if self.provisions:
            await self._provision(nc)
        else:
            await self._wait_provisioned(nc)
        await self.queries.start(nc)
        snapshots = self.snapshots = SnapshotKeeper(
            self.name,
            self.projection,
            SnapshotStore(nc, self.config.snapshot_bucket, replicas=self.config.replicas),
            enabled=self.settings.use_snapshots and self.reads_only is None,
            every=self.settings.snapshot_every,
            check_interval=self.settings.snapshot_check_interval,
        )
        await snapshots.restore(await self._log_state(), self.config.evt_stream)
        if self.reads_only is None:
            self.reader = EventReader(
                nc,
                self.config.evt_stream,
                self._on_event,
                start_after=self.projection.last_seq,
                idle_heartbeat=self.settings.idle_heartbeat,
            )
        else:
            self.reader = DirectReader(
                nc,
                self.config.evt_stream,
                self._on_event,
                subject=self.reads_only,
                passed=self.projection.skip_to,
                start_after=self.projection.last_seq,
            )
        self.activity = ActivityKeeper(
            nc,
            self.config.active_bucket,
            identity=self.identity,
            instance=self.instance,
            ttl_s=self.settings.active_ttl,
            clock=self.clock,
        )
        self.appender = Appender(nc, self.config.evt_stream, guard=self.wait_active)
        self.committer = GroupCommitter(self.appender)
        self.heartbeats.connect(nc)
        try:
            await self.lifecycle.in_task_group(self._serve, stop_cancels=True, first=(ActivityLostError,))
        finally:
            await self.queries.stop()
            if self.activity.role == "active":
                await snapshots.save_on_stop(connected=nc.is_connected)
                await self.before_release()
                # Every acting task has ended: a standby may take over after the margin, not the whole TTL.
                await self.activity.release()
            self.activity.close()
            if self.lifecycle.stopping.is_set() and self.settings.heartbeat_interval > 0:
                # A clean stop says goodbye, so the deacon records it as stopped, not down.
                await self.heartbeats.put(stopping=True)

    async def _provision(self, nc: Connection) -> None:
        since = time.monotonic()
        while True:
            raise_if_cancelling()
            try:
                await provision(nc, self.config)
            except Exception as exc:
                if not retryable(exc):
                    raise
                # JetStream not ready yet (server starting, cluster electing a leader): try again. Expected for a
                # while after a fresh cluster starts: said at info then, at warning once it lasts.
                waited = round(time.monotonic() - since, 1)
                if gt_logging.forming(since, time.monotonic()):
                    log.info("provision_waiting", error=repr(exc), waited_s=waited)
                else:
                    log.warning("provision_retry", error=repr(exc), waited_s=waited)
                await pause(0.5)
                continue
            return

    async def _wait_provisioned(self, nc: Connection) -> None:
        """Until the town's log and the buckets a service writes are there (made by another service, or `gt up`)."""
        since = time.monotonic()
        said: tuple[list[str], float] = ([], 0.0)
        while True:
            raise_if_cancelling()
            try:
                missing = await missing_for_services(nc, self.config)
            except Exception as exc:
                if not retryable(exc):
                    raise
                missing = [type(exc).__name__]
            if not missing:
                return
            now = time.monotonic()
            if missing != said[0] or now - said[1] >= 10.0:  # said when it changes, else every 10 s
                said = (missing, now)
                (log.info if gt_logging.forming(since, now) else log.warning)(
                    "town_not_provisioned_yet", missing=missing, waited_s=round(now - since, 1)
                )
            await pause(0.5)

    async def _log_state(self) -> streams.StreamState:
        """The event log's state, asked again while JetStream is briefly unavailable."""
        assert self.nc is not None
        return await streams.state_when_ready(self.nc, self.config.evt_stream)

    async def catch_up(self, timeout: float | None = None) -> None:
        """Apply everything the log holds now (a decision on what another service stored a moment ago is judged on
        the log as it is, not on a projection a few events behind); a no-op before connecting.

        Raises:
            TimeoutError: not applied within ``timeout`` seconds.
        """
        if self.nc is None or self.reader is None:
            return
        state = await self._log_state()
        await self.reader.wait_for_seq(state.last_seq, timeout=timeout)

    def _heartbeat(self, stopping: bool) -> heartbeats.ServiceHeartbeat:
        return heartbeats.ServiceHeartbeat(
            service=self.identity,
            instance=self.instance,
            pid=os.getpid(),
            host=socket.gethostname(),
            started_at=self._started_wall,
            ts=datetime.now(UTC),
            last_seq=self.projection.last_seq,
            caught_up=bool(self.reader and self.reader.caught_up.is_set()),
            stopping=stopping,
            standby=self.role in ("standby", "lost"),
        )

    def _on_event(self, seq: int, subject: str, data: bytes) -> None:
        self.projection.apply(seq, subject, data)
        self._dirty.set()
        if self.snapshots is not None:
            self.snapshots.applied()

    async def _serve(self, tg: asyncio.TaskGroup) -> None:
        assert self.reader is not None
        assert self.appender is not None
        assert self.committer is not None
        assert self.snapshots is not None
        assert self.activity is not None
        assert self.nc is not None
        tg.create_task(self.reader.run(), name="reader")
        tg.create_task(self.committer.run(), name="committer")
        if self.settings.heartbeat_interval > 0:
            tg.create_task(self.heartbeats.run(), name="heartbeats")
        started = time.monotonic()
        await self.reader.caught_up.wait()
        log.info(
            "caught_up",
            last_seq=self.projection.last_seq,
            applied=self.projection.applied,
            seconds=round(time.monotonic() - started, 3),
        )
        runtime.settle_heap()
        self.following.set()
        self.start_following(tg)
        await self.activity.acquire()  # a standby waits here, following the log and answering queries
        tg.create_task(self.activity.hold(), name="activity")
        await self.catch_up()  # everything stored before this instance became active (a previous active's last events)
        if has_command_consumer(self.name):
            self.intake = CommandIntake(
                service=self.name,
                handler=self,
                identity=self.identity,
                nc=self.nc,
                stream=self.config.cmd_stream,
                durable=command_consumer_name(self.name),
                appender=self.appender,
                committer=self.committer,
                reader=self.reader,
                held_record=(self.config.active_bucket, f"held-{self.identity}"),
                max_in_flight=self.settings.max_in_flight,
                limiter=self.limiter,
            )
            tg.create_task(self.intake.run(), name="intake")
        tg.create_task(self.snapshots.run(), name="snapshots")
        self.start_background(tg)
        if self.tick_s() > 0:
            tg.create_task(self._tick_loop(), name=f"{self.name}-tick")
        self.ready.set()
        # What an operator (and bench (b)) reads to know it serves: caught up, acting, taking commands.
        log.info(
            "service_ready",
            last_seq=self.projection.last_seq,
            applied=self.projection.applied,
            seconds=round(time.monotonic() - self._started_at, 3),
        )
        await self._reconcile_loop()

    async def _reconcile_loop(self) -> None:
        while True:
            raise_if_cancelling()
            await self.wait_active()
            started = time.monotonic()
            try:
                await self.reconcile()
            except ActivityLostError:
                raise
            except Exception:
                self.reconcile_errors += 1
                log.exception("reconcile_failed")
            took = time.monotonic() - started
            self.patrol_last_s, self.patrol_total_s = took, self.patrol_total_s + took
            self.patrol_max_s = max(self.patrol_max_s, took)
            self.reconciles += 1
            await wait_event(self._dirty, self.settings.patrol_interval)
            if (wait := self.reconcile_gap_s() - (time.monotonic() - started - took)) > 0:
                await wait_event(self._urgent, wait)  # events keep coming: the next reconcile sees them all at once
            self._urgent.clear()
            self._dirty.clear()

    async def _tick_loop(self) -> None:
        while True:
            await self.wait_active()
            try:
                await self.tick()
            except ActivityLostError:
                raise
            except Exception:
                # A failed tick (NATS hiccup, a bug) is logged with its traceback. Cancellation is no Exception.
                self.tick_errors += 1
                log.exception(self.tick_failed)
            await pause(self.tick_s())

    async def save_snapshot(self) -> int:
        """Store the projection as this service's snapshot (replacing the stored one); returns the sequence it
        covers (0: not stored)."""
        assert self.snapshots is not None, "connected services only"
        return await self.snapshots.save()

    # ---- queries ------------------------------------------------------------------------------

    def status(self) -> ServiceStatus:
        """What ``gt health`` reports: connection, catch-up, lag and counters. A service with counters of its own
        returns its ``ServiceStatus`` subclass, built on these (``msgspec.structs.asdict(super().status())``)."""
        reader = self.reader
        intake = self.intake
        keeper = self.activity
        since = keeper.active_since if keeper is not None else None
        return ServiceStatus(
            service=self.name,
            identity=self.identity,
            instance=self.instance,
            role=self.role,
            active_since=since.isoformat() if since is not None else None,
            active_holder=keeper.holder.instance if keeper is not None and keeper.holder is not None else None,
            connected=bool(self.nc and self.nc.is_connected),
            caught_up=bool(reader and reader.caught_up.is_set()),
            last_seq=self.projection.last_seq,
            pending=reader.pending if reader else None,
            applied=self.projection.applied,
            skipped=self.projection.skipped,
            fold_errors=self.projection.fold_errors,
            reconcile_errors=self.reconcile_errors,
            reconciles=self.reconciles,
            patrol_last_s=round(self.patrol_last_s, 6),
            patrol_max_s=round(self.patrol_max_s, 6),
            patrol_total_s=round(self.patrol_total_s, 6),
            resyncs=reader.resyncs if reader else 0,
            gaps=reader.gaps if reader else 0,
            commands_processed=intake.processed if intake else 0,
            commands_rejected=intake.rejected if intake else 0,
            commands_dropped=intake.dropped if intake else 0,
            queries_refused=self.queries_refused,
            snapshot_seq=self.snapshots.seq if self.snapshots is not None else 0,
            uptime_s=round(time.monotonic() - self._started_at, 1),
        )
