"""Service lifecycle: connect, rebuild the projection (snapshot + tail), act only once caught up and active.

Several instances of one service scope may run (``shared.activity``): each follows the log and answers queries,
but only the one holding the scope's key in ``GT_ACTIVE`` takes commands, reconciles and writes events; the
others stand by and take over when the key lapses. Every write first checks that this instance may still act.

``run()`` blocks until ``shutdown()`` or a fatal error, which it re-raises (``ActivityLostError`` when another
instance took over). ``shutdown()`` is idempotent and safe before ``run()``. Every loop lives in one TaskGroup;
cancellation is never swallowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar, Generic, TypeVar

import msgspec
import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import StreamInfo
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from shared import heartbeats, rate_limit, runtime, subjects
from shared.aio import pause, raise_if_cancelling, wait_event
from shared.bus import commands as bus_commands
from shared.bus.activity import ActivityKeeper
from shared.bus.append import RETRYABLE_ERRORS, Appender
from shared.bus.commit import GroupCommitter
from shared.bus.connection import close_quietly, connect_unless_stopped
from shared.bus.reader import EventReader
from shared.bus.snapshots import SnapshotStore
from shared.bus.topology import command_consumer_name, has_command_consumer, owner_of, provision
from shared.commands import Command
from shared.config import TownConfig
from shared.decision import Accepted, DecideContext, NewEvent, Route
from shared.decoding import UNDECODABLE
from shared.errors import ActivityLostError, AppendConflictError, QueryError
from shared.intake import CommandIntake, to_pending
from shared.projection import Projection
from shared.rate_limit import RateLimiter

log = structlog.get_logger(__name__)

S = TypeVar("S", bound=msgspec.Struct)
_QUERY_DECODER = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()
MAX_MIN_SEQ_WAIT_S = 10.0


class _ShutdownRequestedError(Exception):
    """Raised inside the task group to unwind it when shutdown() is called."""


class ServiceSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How a service runs (flags of ``gt-<name>``); the town's wiring is in ``TownConfig``."""

    patrol_interval: float = 5.0
    """Seconds between reconcile ticks when nothing happens."""
    use_snapshots: bool = True
    """Start from the newest snapshot (then replay the tail) and store new ones."""
    snapshot_every: int = 50_000
    """Store a snapshot once this many events were applied since the last one (0 = only at shutdown)."""
    snapshot_check_interval: float = 30.0
    """Seconds between checks whether a snapshot is due."""
    idle_heartbeat: float = 2.0
    """Heartbeat of the log subscription; a lost subscription is noticed within a few of these."""
    max_in_flight: int = 4_096
    """Commands being settled at once (the rest wait in GT_CMD)."""
    heartbeat_interval: float = 1.0
    """Seconds between this service's heartbeats in the ``GT_SERVICES`` bucket (0: none); the deacon calls a
    service down when it misses a few."""
    active_ttl: float = 6.0
    """Seconds of the scope's activity key (``GT_ACTIVE_TTL``): renewed every third of it; the holder stops
    acting two thirds of it after its last renewal; a standby takes a key over once unchanged for all of it."""


class Service(Generic[S]):
    """Base of mayor, witness, refinery and deacon. Subclasses set ``name`` and override the hooks."""

    name: ClassVar[str] = "service"

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
        self.nc: Client | None = None
        self.reader: EventReader | None = None
        self.appender: Appender | None = None
        self.committer: GroupCommitter | None = None
        self.intake: CommandIntake | None = None
        self.ready = asyncio.Event()
        """Set once caught up with the log and serving."""
        self._stop = asyncio.Event()
        self._dirty = asyncio.Event()
        self._snapshot_wanted = asyncio.Event()
        """Set when the projection says a snapshot is due now (after a garbage collection sweep)."""
        self._started = False
        self._snapshot_seq = 0
        self._stream_id = ""
        self._started_at = time.monotonic()
        self._query_tasks: set[asyncio.Task[None]] = set()
        self.queries_refused = 0
        """Queries not answered: their reply subject was no inbox (``subjects.is_inbox``)."""
        self.instance = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        """This process of the service, as its heartbeats name it."""
        self.activity: ActivityKeeper | None = None
        """This instance's side of its scope's activity key (set once connected)."""
        self.following = asyncio.Event()
        """Set once caught up with the log: queries are answered from then on, by a standby too."""
        self._started_wall = datetime.now(UTC)
        self._services_kv: KeyValue | None = None
        self.reconcile_errors = 0
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

    def wake(self) -> None:
        """Reconcile again soon (something observed changed, or an action finished)."""
        self._dirty.set()

    async def store(self, cmd: Command) -> int:
        """Store a command for another service in GT_CMD (its outcome comes later, in the log), once this instance
        may act; returns its GT_CMD sequence. Its ``cmd_id`` (required) makes it idempotent: the same id is carried
        out once, so a resend after a crash is harmless.

        It is sent on this service's own subject (``gt.cmd.bead.close.svc.refinery``), which is what makes it this
        service's: the intake records its actor from there, never from the body (whose ``actor`` may only name what
        the service acts for, the deacon's ``automation:<name>``). Resent while the stream is unreachable, for as
        long as it takes; a refusal by the server's permissions (a deployment error) is raised, not retried."""
        assert self.nc is not None
        return await bus_commands.store(
            self.nc,
            self.config.cmd_stream,
            cmd,
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

    def aggregate_key(self, cmd: Command) -> str | None:
        """Commands with the same key are decided one after the other (None: no ordering needed)."""
        return None

    def route(self, cmd: Command) -> Route:
        """Which scope settles ``cmd`` when several instances with disjoint scopes share the command consumer."""
        return "mine"

    def query(self, what: str, body: dict[str, Any]) -> Any:
        """Answer ``gt.q.<name>.<what>`` from the projection."""
        raise QueryError("unknown_query", f"{self.name} has no query {what!r}")

    def query_for_session(self, what: str, body: dict[str, Any], session: str) -> Any:
        """Answer ``gt.q.<name>.<what>`` asked from polecat session ``session``'s private inbox (after
        ``check_session_query``): a service whose lists hold one session's or polecat's own things leaves out the
        others' here. Everything else is answered as ``query`` answers it."""
        return self.query(what, body)

    def check_session_query(self, what: str, body: dict[str, Any], session: str) -> None:
        """Refuse (``QueryError`` ``unauthorized``) what polecat session ``session`` may not ask about: called for
        a query whose reply goes to a session's private inbox, which only that session may read (its NATS
        identity subscribes nowhere else). A service whose answers hold one session's or polecat's own things
        (mail, nudges) overrides it; everything else is the town's, readable by every session."""

    # ---- lifecycle ----------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Ask ``run()`` to stop; returns at once. Safe to call any number of times, also before ``run()``."""
        self._stop.set()

    async def __aenter__(self) -> Service[S]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def run(self) -> None:
        """Serve until ``shutdown()``; re-raises the error that made the service stop otherwise."""
        if self._started:
            raise RuntimeError(f"{self.name} already ran")
        self._started = True
        if self._stop.is_set():
            return
        with structlog.contextvars.bound_contextvars(service=self.name):
            nc = await connect_unless_stopped(self.config, f"gt-{self.name}", self._stop)
            if nc is None:
                return
            self.nc = nc
            try:
                await self._run_connected(self.nc)
            finally:
                await close_quietly(self.nc)

    async def _run_connected(self, nc: Client) -> None:
        js = nc.jetstream()
        await self._provision(js)
        query_sub = await nc.subscribe(
            subjects.query_subject(self.name, ">"), queue=f"{self.name}-q", cb=self._on_query
        )
        snapshots = SnapshotStore(js, self.config.snapshot_bucket, replicas=self.config.replicas)
        await self._restore_snapshot(js, snapshots)
        self._snapshot_seq = self.projection.last_seq
        self.reader = EventReader(
            js,
            self.config.evt_stream,
            self._on_event,
            start_after=self.projection.last_seq,
            idle_heartbeat=self.settings.idle_heartbeat,
        )
        self.activity = ActivityKeeper(
            js,
            self.config.active_bucket,
            identity=self.identity,
            instance=self.instance,
            ttl_s=self.settings.active_ttl,
            clock=self.clock,
        )
        self.appender = Appender(nc, js, self.config.evt_stream, guard=self.wait_active)
        self.committer = GroupCommitter(self.appender)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._stop_watch(), name="stop-watch")
                tg.create_task(self.reader.run(), name="reader")
                tg.create_task(self.committer.run(), name="committer")
                tg.create_task(self._serve(js, tg, snapshots), name="serve")
                if self.settings.heartbeat_interval > 0:
                    tg.create_task(self._heartbeat_loop(js), name="heartbeats")
        except BaseExceptionGroup as group:
            errors = [e for e in group.exceptions if not isinstance(e, _ShutdownRequestedError)]
            lost = [e for e in errors if isinstance(e, ActivityLostError)]
            if lost:
                # Several tasks may notice at once; what stopped the service is that it is not the active one.
                raise lost[0] from group
            if len(errors) == 1:
                # Re-raise the error itself, not a group of one, so callers see what failed.
                raise errors[0] from group
            if errors:
                raise
        finally:
            with contextlib.suppress(nats.errors.Error):
                await query_sub.unsubscribe()
            for task in list(self._query_tasks):
                task.cancel()
            if self.activity is not None and self.activity.role == "active":
                await self._final_snapshot(nc, snapshots)
                # Every acting task has ended: a standby may take over after the margin, not the whole TTL.
                await self.activity.release()
            if self.activity is not None:
                self.activity.close()
            if self._stop.is_set() and self.settings.heartbeat_interval > 0:
                # A clean stop says goodbye, so the deacon records it as stopped, not down.
                await self._put_heartbeat(js, stopping=True)

    async def _provision(self, js: JetStreamContext) -> None:
        while True:
            raise_if_cancelling()
            try:
                await provision(js, self.config)
            except RETRYABLE_ERRORS as exc:
                # JetStream not ready yet (server starting, cluster electing a leader): try again.
                log.warning("provision_retry", error=repr(exc))
                await pause(0.5)
                continue
            return

    async def _log_info(self, js: JetStreamContext) -> StreamInfo:
        """The event log's stream info, asked again while JetStream is briefly unavailable."""
        while True:
            raise_if_cancelling()
            try:
                return await js.stream_info(self.config.evt_stream)
            except RETRYABLE_ERRORS as exc:
                log.warning("stream_info_retry", error=repr(exc))
                await pause(0.5)

    async def _restore_snapshot(self, js: JetStreamContext, snapshots: SnapshotStore) -> None:
        info = await self._log_info(js)
        created = getattr(info, "created", None)
        self._stream_id = created.isoformat() if created is not None else self.config.evt_stream
        if not self.settings.use_snapshots:
            return
        started = time.monotonic()
        data = await snapshots.load(self.name)
        if data is None:
            return
        if self.projection.restore(data, stream_id=self._stream_id, stream_last_seq=int(info.state.last_seq)):
            log.info(
                "snapshot_loaded",
                last_seq=self.projection.last_seq,
                bytes=len(data),
                seconds=round(time.monotonic() - started, 3),
            )

    async def _final_snapshot(self, nc: Client, snapshots: SnapshotStore) -> None:
        if not self.settings.use_snapshots or self.projection.last_seq <= self._snapshot_seq or not nc.is_connected:
            return
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            async with asyncio.timeout(10):
                await self.save_snapshot(snapshots)

    async def _heartbeat_loop(self, js: JetStreamContext) -> None:
        while True:
            await self._put_heartbeat(js)
            await pause(self.settings.heartbeat_interval)

    async def _put_heartbeat(self, js: JetStreamContext, *, stopping: bool = False) -> None:
        beat = heartbeats.ServiceHeartbeat(
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
        try:
            async with asyncio.timeout(max(1.0, self.settings.heartbeat_interval * 2)):
                if self._services_kv is None:
                    self._services_kv = await js.key_value(self.config.service_bucket)
                await self._services_kv.put(heartbeats.key_of(self.identity, self.instance), heartbeats.encode(beat))
        except (nats.errors.Error, TimeoutError) as exc:
            # A missed heartbeat is what liveness detection is for; the next one tries again.
            log.warning("heartbeat_failed", error=repr(exc))

    async def _stop_watch(self) -> None:
        await self._stop.wait()
        raise _ShutdownRequestedError

    def _on_event(self, seq: int, subject: str, data: bytes) -> None:
        self.projection.apply(seq, subject, data)
        self._dirty.set()
        if self.projection.snapshot_due:
            self._snapshot_wanted.set()

    async def _serve(self, js: JetStreamContext, tg: asyncio.TaskGroup, snapshots: SnapshotStore) -> None:
        assert self.reader is not None
        assert self.appender is not None
        assert self.committer is not None
        assert self.nc is not None
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
        assert self.activity is not None
        await self.activity.acquire()  # a standby waits here, following the log and answering queries
        tg.create_task(self.activity.hold(), name="activity")
        await self._catch_up_with_stream(js)
        if has_command_consumer(self.name):
            self.intake = CommandIntake(
                service=self.name,
                identity=self.identity,
                nc=self.nc,
                js=js,
                stream=self.config.cmd_stream,
                durable=command_consumer_name(self.name),
                appender=self.appender,
                committer=self.committer,
                reader=self.reader,
                decide=self.decide,
                key_of=self.aggregate_key,
                owns=lambda subject: owner_of(subject) == self.name,
                # Only a service whose instances hand each other commands routes them (the witness); the others'
                # deliveries all count towards setting aside a command a service keeps dying on.
                route=self.route if type(self).route is not Service.route else None,
                prepare=self.prepare,
                held_record=(self.config.active_bucket, f"held-{self.identity}"),
                max_in_flight=self.settings.max_in_flight,
                limiter=self.limiter,
                clock=self.clock,
            )
            tg.create_task(self.intake.run(), name="intake")
        tg.create_task(self._snapshot_loop(snapshots), name="snapshots")
        self.start_background(tg)
        self.ready.set()
        await self._reconcile_loop()

    async def _catch_up_with_stream(self, js: JetStreamContext) -> None:
        """Apply everything stored before this instance became active (a previous active's last events)."""
        assert self.reader is not None
        info = await self._log_info(js)
        await self.reader.wait_for_seq(int(info.state.last_seq))

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
            self._dirty.clear()

    async def _snapshot_loop(self, snapshots: SnapshotStore) -> None:
        if not self.settings.use_snapshots or self.settings.snapshot_every <= 0:
            return
        while True:  # started once active: a standby stores no snapshot (the active one's is the same fold)
            raise_if_cancelling()
            # Woken at once when the projection wants a snapshot now (a compacted state after a GC sweep).
            await wait_event(self._snapshot_wanted, self.settings.snapshot_check_interval)
            self._snapshot_wanted.clear()
            behind = self.projection.last_seq - self._snapshot_seq
            if self.projection.snapshot_due or behind >= self.settings.snapshot_every:
                await self.save_snapshot(snapshots)

    async def save_snapshot(self, snapshots: SnapshotStore | None = None) -> int:
        """Store the projection as this service's snapshot (replacing the stored one); returns the sequence it
        covers (0: not stored)."""
        if snapshots is None:
            assert self.nc is not None
            snapshots = SnapshotStore(self.nc.jetstream(), self.config.snapshot_bucket, replicas=self.config.replicas)
        seq = self.projection.last_seq
        wanted, self.projection.snapshot_due = self.projection.snapshot_due, False
        data = self.projection.snapshot(self._stream_id)
        try:
            await snapshots.save(self.name, data)
        except (TimeoutError, nats.errors.Error) as exc:
            log.warning("snapshot_save_failed", error=repr(exc))
            self.projection.snapshot_due = self.projection.snapshot_due or wanted  # tried again at the next check
            return 0
        self._snapshot_seq = seq
        log.info("snapshot_saved", last_seq=seq, bytes=len(data))
        return seq

    # ---- queries ------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What ``gt health`` reports: connection, catch-up, lag and counters."""
        reader = self.reader
        intake = self.intake
        keeper = self.activity
        since = keeper.active_since if keeper is not None else None
        return {
            "service": self.name,
            "identity": self.identity,
            "instance": self.instance,
            "role": self.role,
            "active_since": since.isoformat() if since is not None else None,
            "active_holder": keeper.holder.instance if keeper is not None and keeper.holder is not None else None,
            "connected": bool(self.nc and self.nc.is_connected),
            "caught_up": bool(reader and reader.caught_up.is_set()),
            "last_seq": self.projection.last_seq,
            "pending": reader.pending if reader else None,
            "applied": self.projection.applied,
            "skipped": self.projection.skipped,
            "fold_errors": self.projection.fold_errors,
            "reconcile_errors": self.reconcile_errors,
            "reconciles": self.reconciles,
            "patrol_last_s": round(self.patrol_last_s, 6),
            "patrol_max_s": round(self.patrol_max_s, 6),
            "patrol_total_s": round(self.patrol_total_s, 6),
            "resyncs": reader.resyncs if reader else 0,
            "gaps": reader.gaps if reader else 0,
            "commands_processed": intake.processed if intake else 0,
            "commands_rejected": intake.rejected if intake else 0,
            "commands_dropped": intake.dropped if intake else 0,
            "queries_refused": self.queries_refused,
            "snapshot_seq": self._snapshot_seq,
            "uptime_s": round(time.monotonic() - self._started_at, 1),
        }

    async def _on_query(self, msg: Msg) -> None:
        if not subjects.is_inbox(msg.reply or ""):
            # The answer would be published with this service's rights (the log, KV, commands) on a subject the
            # asker chose: a forged event, an overwritten key. Only an inbox gets an answer.
            self.queries_refused += 1
            if self.queries_refused % 1000 == 1:
                log.warning(
                    "query_reply_refused",
                    reply=(msg.reply or "")[:120],
                    subject=msg.subject,
                    refused=self.queries_refused,
                )
            return
        task = asyncio.create_task(self._answer(msg))
        self._query_tasks.add(task)
        task.add_done_callback(self._query_tasks.discard)

    async def _answer(self, msg: Msg) -> None:
        what = msg.subject.rsplit(".", 1)[-1]
        try:
            reply = await self._answer_query(what, msg.data, subjects.session_of_inbox(msg.reply or ""))
        except QueryError as exc:
            reply = {"ok": False, "code": exc.code, "message": exc.message}
        except Exception as exc:
            log.exception("query_failed", query=what)
            reply = {"ok": False, "code": "error", "message": f"{self.name} failed to answer: {exc!r}"}
        if msg.reply:
            with contextlib.suppress(nats.errors.Error):
                await msg.respond(_ENCODER.encode(reply))

    async def _answer_query(self, what: str, data: bytes, session: str | None = None) -> dict[str, Any]:
        try:
            body: Any = _QUERY_DECODER.decode(data) if data.strip() else {}
        except UNDECODABLE as exc:
            raise QueryError("malformed", f"query body is not JSON: {exc!r:.300}") from None
        if not isinstance(body, dict):
            raise QueryError("malformed", "a query body must be a JSON object")
        if session is not None:
            self.check_session_query(what, body, session)
        if what == "status":
            return {"ok": True, "seq": self.projection.last_seq, "result": self.status()}
        min_seq = body.get("min_seq", 0)
        if not isinstance(min_seq, int) or isinstance(min_seq, bool) or min_seq < 0:
            raise QueryError("invalid", "`min_seq` must be a non-negative integer")
        try:
            async with asyncio.timeout(MAX_MIN_SEQ_WAIT_S):
                await self.following.wait()
            assert self.reader is not None
            await self.reader.wait_for_seq(min_seq, timeout=MAX_MIN_SEQ_WAIT_S)
        except TimeoutError:
            raise QueryError(
                "lagging", f"{self.name} has applied up to {self.projection.last_seq}, not yet {min_seq}; try again"
            ) from None
        if what == "digest":
            # For checks that the live projection equals a fresh replay of the log up to ``last_seq``.
            digest = hashlib.sha256(self.projection.serialize_state()).hexdigest()
            return {
                "ok": True,
                "seq": self.projection.last_seq,
                "result": {"last_seq": self.projection.last_seq, "sha256": digest},
            }
        result = self.query(what, body) if session is None else self.query_for_session(what, body, session)
        return {"ok": True, "seq": self.projection.last_seq, "result": result}
