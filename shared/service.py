"""Service lifecycle: connect, rebuild the projection (snapshot + tail), act only once caught up.

``run()`` blocks until ``shutdown()`` or a fatal error, which it re-raises. ``shutdown()`` is idempotent and
safe before ``run()``. Every loop lives in one TaskGroup; cancellation is never swallowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Generic, TypeVar

import msgspec
import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg

from shared.bus.append import Appender
from shared.bus.connection import connect
from shared.bus.reader import EventReader
from shared.bus.snapshots import SnapshotStore
from shared.bus.topology import command_consumer_name, provision
from shared.commands import Command
from shared.config import TownConfig
from shared.decision import Accepted, DecideContext
from shared.errors import QueryError
from shared.intake import CommandIntake
from shared.projection import Projection

log = structlog.get_logger(__name__)

S = TypeVar("S", bound=msgspec.Struct)
_QUERY_DECODER = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()
MAX_MIN_SEQ_WAIT_S = 10.0


class _ShutdownRequestedError(Exception):
    """Raised inside the task group to unwind it when shutdown() is called."""


class ServiceSettings(msgspec.Struct, frozen=True, kw_only=True):
    patrol_interval: float = 5.0
    """Seconds between reconcile ticks when nothing happens."""
    snapshot_every: int = 10_000
    """Store a snapshot once this many events were applied since the last one (0 = never)."""
    snapshot_check_interval: float = 30.0
    use_snapshots: bool = True
    connect_attempts: int = 1_000_000
    idle_heartbeat: float = 2.0
    max_in_flight: int = 2_000


class Service(Generic[S]):
    """Base of mayor, witness, refinery and deacon. Subclasses set ``name`` and override the hooks."""

    name = "service"
    owns_commands = False
    catch_all_commands = False

    def __init__(self, config: TownConfig, projection: Projection[S], settings: ServiceSettings | None = None) -> None:
        self.config = config
        self.projection = projection
        self.settings = settings or ServiceSettings()
        self.nc: Client | None = None
        self.reader: EventReader | None = None
        self.appender: Appender | None = None
        self.intake: CommandIntake | None = None
        self._stop = asyncio.Event()
        self._dirty = asyncio.Event()
        self._started = False
        self._snapshot_seq = 0
        self._started_at = time.monotonic()
        self._query_tasks: set[asyncio.Task[None]] = set()
        self.ready = asyncio.Event()
        """Set once caught up and serving."""

    # ---- hooks --------------------------------------------------------------------------------

    async def reconcile(self) -> None:
        """Compute and carry out the actions still owed (after catch-up, after events, on each patrol tick)."""

    def decide(self, cmd: Command, ctx: DecideContext) -> Accepted:
        raise NotImplementedError

    def aggregate_key(self, cmd: Command) -> str | None:
        return None

    def query(self, what: str, body: dict[str, Any]) -> Any:
        raise QueryError("unknown_query", f"{self.name} has no query {what!r}")

    # ---- lifecycle ----------------------------------------------------------------------------

    async def shutdown(self) -> None:
        self._stop.set()

    async def __aenter__(self) -> Service[S]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def run(self) -> None:
        if self._started:
            raise RuntimeError(f"{self.name} already ran")
        self._started = True
        if self._stop.is_set():
            return
        with structlog.contextvars.bound_contextvars(service=self.name):
            self.nc = await connect(self.config, name=f"gt-{self.name}", connect_attempts=self.settings.connect_attempts)
            try:
                await self._run_connected(self.nc)
            finally:
                with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
                    await self.nc.drain()

    async def _run_connected(self, nc: Client) -> None:
        js = nc.jetstream()
        await provision(js, self.config)
        snapshots = SnapshotStore(js, self.config.snapshot_bucket, replicas=self.config.replicas)
        if self.settings.use_snapshots:
            data = await snapshots.load(self.name)
            if data is not None and self.projection.restore(data):
                log.info("snapshot_loaded", last_seq=self.projection.last_seq)
        self._snapshot_seq = self.projection.last_seq
        self.reader = EventReader(
            js, self.config.evt_stream, self._on_event,
            start_after=self.projection.last_seq, idle_heartbeat=self.settings.idle_heartbeat,
        )
        self.appender = Appender(nc, js, self.config.evt_stream)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._stop_watch())
                tg.create_task(self.reader.run())
                tg.create_task(self._serve(js, tg))
        except* _ShutdownRequestedError:
            pass
        finally:
            if self.settings.use_snapshots and self.projection.last_seq > self._snapshot_seq and nc.is_connected:
                with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
                    await asyncio.wait_for(snapshots.save(self.name, self.projection.snapshot()), 5)

    async def _stop_watch(self) -> None:
        await self._stop.wait()
        raise _ShutdownRequestedError

    def _on_event(self, seq: int, subject: str, data: bytes) -> None:
        self.projection.apply(seq, subject, data)
        self._dirty.set()

    async def _serve(self, js: Any, tg: asyncio.TaskGroup) -> None:
        assert self.reader is not None and self.nc is not None and self.appender is not None
        started = time.monotonic()
        await self.reader.caught_up.wait()
        log.info(
            "caught_up", last_seq=self.projection.last_seq, applied=self.projection.applied,
            seconds=round(time.monotonic() - started, 3),
        )
        await self.nc.subscribe(f"gt.q.{self.name}.>", queue=f"{self.name}-q", cb=self._on_query)
        if self.owns_commands:
            self.intake = CommandIntake(
                service=self.name, js=js, stream=self.config.cmd_stream,
                durable=command_consumer_name(self.name), appender=self.appender, reader=self.reader,
                decide=self.decide, key_of=self.aggregate_key, catch_all=self.catch_all_commands,
                max_in_flight=self.settings.max_in_flight,
            )
            tg.create_task(self.intake.run())
        tg.create_task(self._snapshot_loop(js))
        self.ready.set()
        await self._reconcile_loop()

    async def _reconcile_loop(self) -> None:
        while True:
            await self.reconcile()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), timeout=self.settings.patrol_interval)
            self._dirty.clear()

    async def _snapshot_loop(self, js: Any) -> None:
        if not self.settings.use_snapshots or self.settings.snapshot_every <= 0:
            return
        store = SnapshotStore(js, self.config.snapshot_bucket, replicas=self.config.replicas)
        while True:
            await asyncio.sleep(self.settings.snapshot_check_interval)
            if self.projection.last_seq - self._snapshot_seq >= self.settings.snapshot_every:
                await self.save_snapshot(store)

    async def save_snapshot(self, store: SnapshotStore | None = None) -> None:
        assert self.nc is not None
        store = store or SnapshotStore(self.nc.jetstream(), self.config.snapshot_bucket, replicas=self.config.replicas)
        seq = self.projection.last_seq
        try:
            await store.save(self.name, self.projection.snapshot())
        except (nats.errors.Error, asyncio.TimeoutError) as exc:
            log.warning("snapshot_save_failed", error=repr(exc))
            return
        self._snapshot_seq = seq
        log.info("snapshot_saved", last_seq=seq)

    # ---- queries ------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        reader = self.reader
        return {
            "service": self.name,
            "last_seq": self.projection.last_seq,
            "applied": self.projection.applied,
            "skipped": self.projection.skipped,
            "caught_up": bool(reader and reader.caught_up.is_set()),
            "pending": reader.pending if reader else None,
            "resyncs": reader.resyncs if reader else 0,
            "commands_processed": self.intake.processed if self.intake else 0,
            "uptime_s": round(time.monotonic() - self._started_at, 1),
        }

    async def _on_query(self, msg: Msg) -> None:
        task = asyncio.create_task(self._answer(msg))
        self._query_tasks.add(task)
        task.add_done_callback(self._query_tasks.discard)

    async def _answer(self, msg: Msg) -> None:
        what = msg.subject.rsplit(".", 1)[-1]
        try:
            body: Any = _QUERY_DECODER.decode(msg.data) if msg.data.strip() else {}
            if not isinstance(body, dict):
                raise QueryError("malformed", "a query body must be a JSON object")
            min_seq = body.get("min_seq")
            if min_seq is not None:
                if not isinstance(min_seq, int) or min_seq < 0:
                    raise QueryError("invalid", "`min_seq` must be a non-negative integer")
                assert self.reader is not None
                try:
                    await self.reader.wait_for_seq(min_seq, timeout=MAX_MIN_SEQ_WAIT_S)
                except TimeoutError:
                    raise QueryError(
                        "lagging", f"{self.name} has applied up to {self.projection.last_seq}, not yet {min_seq}"
                    ) from None
            result = self.status() if what == "status" else self.query(what, body)
            reply: dict[str, Any] = {"ok": True, "seq": self.projection.last_seq, "result": result}
        except msgspec.DecodeError as exc:
            reply = {"ok": False, "code": "malformed", "message": f"query body is not JSON: {exc}"}
        except QueryError as exc:
            reply = {"ok": False, "code": exc.code, "message": exc.message}
        if msg.reply:
            with contextlib.suppress(nats.errors.Error):
                await msg.respond(_ENCODER.encode(reply))
