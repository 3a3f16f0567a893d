"""The plugin SDK: a named, durable, ordered, at-least-once reader of ``GT_EVT`` with typed events.

A plugin named N follows the log by batched direct gets (``shared.bus.log_read``) from its position, the last
sequence it is done with, which it keeps in its marks (``N.position.last`` in ``GT_PLUGINS``) and records after
each batch: a restarted plugin resumes where it left off. It needs no JetStream consumer, so it runs in account
PLUGINS, which may not create one (ops/nats/accounts.conf). Once caught up it looks for new events after
``poll_s``, waiting twice as long each time none came, up to ``max_poll_s``.

Its handler gets ``(seq, envelope, payload)`` one event at a time, in stream order; the payload is None for a type
this code does not know (logged, then passed like any other). A handler that raises gets the event again after a
bounded backoff, and no later event is handed over before it succeeds; after ``max_attempts`` failures the plugin
either stops (its position stays before the event) or records the event as abandoned and goes on
(``on_exhausted``). Delivery is at-least-once (a process that dies mid-batch handles the batch's events again):
``once`` (marks in the ``GT_PLUGINS`` bucket) makes side effects exactly-once.

``run()`` blocks until ``shutdown()`` or a fatal error, which it re-raises; ``shutdown()`` is idempotent
and safe before ``run()``: the run skeleton is the services' (``shared.service.lifecycle``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, NamedTuple

import msgspec
import structlog

from shared.bus import log_read, streams
from shared.bus.connection import Connection
from shared.bus.errors import BusError
from shared.bus.streams import Stored
from shared.core.aio import raise_if_cancelling, wait_event
from shared.core.config import TownConfig
from shared.core.errors import EventDecodeError, GastownError, UnknownEventTypeError, retryable
from shared.core.faults import crash_point
from shared.model.events import REGISTRY, Envelope, Event, EventRegistry, decode_envelope
from shared.plugins.marks import Claim, Marks
from shared.plugins.position import StartPlan, plan_start
from shared.plugins.settings import (
    CONSUMER_PREFIX,
    PLUGIN_BUCKET,
    PluginSettings,
    backoff,
    matches,
    server_filter,
    validate,
)
from shared.service.lifecycle import Lifecycle

log = structlog.get_logger(__name__)

Handler = Callable[[int, Envelope, Event | None], Awaitable[None]]
"""``(stream sequence, envelope, typed payload or None)``; raise to have the event handed over again."""
_ENCODER = msgspec.json.Encoder()
MAX_BATCH_BYTES = 4 * 1024 * 1024
"""The server stops a batch once it has sent this much (at least one event: an event is at most 1 MiB)."""
READ_RETRY_S = 0.5
"""Wait before reading again after NATS failed to answer a read."""


class Delivery(NamedTuple):
    """One event as it is handed to the plugin."""

    seq: int
    subject: str
    data: bytes
    """The stored bytes (the JSON envelope, unless a foreign writer stored something else)."""
    delivered: int
    """How many times this process has handed it over (1: the first time; more after failures)."""
    pending: int
    """Events stored after this one that the plugin has yet to read, as the server counted when it answered."""


class PluginStoppedError(GastownError):
    """An event kept failing and the plugin's policy is to stop rather than pass over it."""

    def __init__(self, plugin: str, seq: int, attempts: int, error: BaseException) -> None:
        self.plugin = plugin
        self.seq = seq
        self.attempts = attempts
        super().__init__(
            f"plugin {plugin} stopped: event {seq} failed {attempts} times (last error: {error!r}); its position "
            "stays before it, so it is the first event handled when the plugin starts again"
        )


class Plugin:
    """Subclass and override ``handle`` (or pass ``handler``); see the module docstring."""

    def __init__(
        self,
        config: TownConfig,
        settings: PluginSettings,
        handler: Handler | None = None,
        *,
        registry: EventRegistry = REGISTRY,
        bucket: str = PLUGIN_BUCKET,
    ) -> None:
        validate(settings)
        cls = type(self)
        if handler is None and cls.handle is Plugin.handle and cls.handle_message is Plugin.handle_message:
            raise TypeError("a plugin needs a handler: pass handler= or override handle()")
        self.config = config
        self.settings = settings
        self.name = settings.name
        self._handler = handler
        self._registry = registry
        self._bucket = bucket
        self.nc: Connection | None = None
        self.marks: Marks | None = None
        self.ready = asyncio.Event()
        """Set once the plugin knows where it starts and events are being read."""
        self.caught_up = asyncio.Event()
        """Set the first time the plugin has handled everything the log held (nothing more to read)."""
        self.start_plan: StartPlan | None = None
        self.last_seq = 0
        """Stream sequence of the last event this process handled (or abandoned)."""
        self.position = 0
        """The last sequence the plugin is done with: every event up to it was handled, abandoned or outside its
        subjects. Recorded in its marks after each batch (``recorded``)."""
        self.recorded: int | None = None
        """The position as last recorded in the marks (None: not yet, by this process)."""
        self.handled = 0
        self.failed_attempts = 0
        self.abandoned = 0
        self.undecodable = 0
        self.unknown = 0
        self.lifecycle = Lifecycle(
            config, label=f"plugin {self.name}", client_name=f"gt-plugin-{self.name}", log_context={"plugin": self.name}
        )
        self._stop = self.lifecycle.stopping
        self._server_filter = server_filter(settings.subjects)
        self._reported: set[str] = set()

    # ---- hooks --------------------------------------------------------------------------------

    async def handle(self, seq: int, env: Envelope, payload: Event | None) -> None:
        """Act on one event. Raise to have it handed over again (after a backoff)."""
        if self._handler is None:
            raise NotImplementedError("override handle() or pass handler=")
        await self._handler(seq, env, payload)

    async def handle_message(self, delivery: Delivery) -> None:
        """Decode and call ``handle``. Override to see the stored bytes as they are (the archiver does); an
        envelope that does not decode is logged and passed over here, since ``handle`` needs one."""
        try:
            env = decode_envelope(delivery.data)
        except EventDecodeError as exc:
            self.undecodable += 1
            log.warning("plugin_event_undecodable", seq=delivery.seq, subject=delivery.subject, error=str(exc))
            return
        await self.handle(delivery.seq, env, self.decode_payload(env, delivery.seq))

    async def prepare(self) -> None:
        """Called once connected, before the plugin decides where it starts reading (open files, load state)."""

    async def resume_after(self) -> int | None:
        """The last stream sequence this plugin holds by its own records, if it keeps any: reading starts at the
        next one, whatever position its marks hold. None: the recorded position is the record."""
        return None

    def start_background(self, tg: asyncio.TaskGroup) -> None:
        """Start the plugin's own loops (a server, a flush timer) in the plugin's task group."""

    async def close(self) -> None:
        """Called on the way out, after the last event was handled (flush, close files)."""

    # ---- for handlers -------------------------------------------------------------------------

    def once(self, event_id: str) -> AbstractAsyncContextManager[Claim]:
        """``async with plugin.once(env.id) as claim: if claim.first: <side effect>``; see ``marks``."""
        return self._require_marks().once(event_id)

    async def seen(self, event_id: str) -> bool:
        """True when a side effect for this event was recorded as done (by ``once`` or ``mark_done``)."""
        return await self._require_marks().seen(event_id)

    async def mark_done(self, event_id: str) -> None:
        await self._require_marks().mark_done(event_id)

    def decode_payload(self, env: Envelope, seq: int) -> Event | None:
        """The typed payload, or None (logged once per type) when the type is unknown or does not decode."""
        try:
            return self._registry.decode_payload(env)
        except UnknownEventTypeError:
            self.unknown += 1
            self._report_once(env.type, "plugin_event_type_unknown", seq=seq, type=env.type, v=env.v)
        except EventDecodeError as exc:
            self.unknown += 1
            self._report_once(env.type, "plugin_event_payload_invalid", seq=seq, type=env.type, error=str(exc))
        return None

    def _require_marks(self) -> Marks:
        if self.marks is None:
            raise RuntimeError("marks are available once the plugin runs (inside handle)")
        return self.marks

    def _report_once(self, key: str, event: str, **fields: Any) -> None:
        # Once per type: a newer writer may store thousands of a type this code does not know yet.
        if key not in self._reported:
            self._reported.add(key)
            log.warning(event, **fields)

    # ---- lifecycle ----------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Ask ``run()`` to stop after the event in hand; returns at once. Idempotent, safe before ``run()``."""
        self.lifecycle.shutdown()

    async def run(self) -> None:
        """Follow the log until ``shutdown()``; re-raises the error that made the plugin stop otherwise."""
        await self.lifecycle.run(self._run_connected)

    async def _run_connected(self, nc: Connection) -> None:
        self.nc = nc
        if not await self._wait_for_stream(nc):
            return
        self.marks = Marks(nc, self._bucket, self.name)
        found = await self._wait_for_marks(self.marks)
        if found is None:
            return
        _, recorded = found
        await self.prepare()
        try:
            self.start_plan = await self._position(nc, recorded)

            async def follow(tg: asyncio.TaskGroup) -> None:
                self.start_background(tg)
                self.ready.set()
                await self._follow(nc)

            # Not cancelled at shutdown(): reading stops after the event in hand, then the group ends.
            await self.lifecycle.in_task_group(follow, stop_cancels=False)
        finally:
            await self.close()

    async def _wait_for_stream(self, nc: Connection) -> bool:
        """False when stopped before the event log existed (a plugin may start before the town)."""
        waiting = False
        while not self._stop.is_set():
            raise_if_cancelling()
            try:
                if await streams.exists(nc, self.config.evt_stream):
                    return True
                if not waiting:
                    log.warning("plugin_waiting_for_stream", stream=self.config.evt_stream)
                    waiting = True
            except Exception as exc:
                if not retryable(exc):
                    raise
                log.warning("plugin_stream_info_failed", error=repr(exc))
            await wait_event(self._stop, 1.0)
        return False

    async def _wait_for_marks(self, marks: Marks) -> tuple[bool, int | None] | None:
        """``(True, recorded position or None)`` once the marks bucket answers; None when stopped before. The
        services make the bucket when they provision the town; a plugin waits for it (it may not make it)."""
        waiting = False
        while not self._stop.is_set():
            raise_if_cancelling()
            try:
                return True, await marks.position()
            except Exception as exc:
                if not retryable(exc):
                    raise
                if not waiting:
                    log.warning("plugin_waiting_for_marks", bucket=self._bucket, error=repr(exc))
                    waiting = True
            await wait_event(self._stop, 1.0)
        return None

    async def _position(self, nc: Connection, recorded: int | None) -> StartPlan:
        resume = await self.resume_after()
        replay = self.settings.replay_from_start
        floor = None
        if not replay and resume is None and recorded is None:
            floor = await self._old_consumer_floor(nc)
        plan = plan_start(recorded, replay=replay, resume_after=resume, consumer_floor=floor)
        self.position = plan.start_seq - 1
        self.recorded = None if replay else recorded  # a replay purges it: recorded again below
        if replay:
            assert self.marks is not None
            await self.marks.purge()
            # Recorded at once: a run stopped before its first batch starts at 1 again, not at an old consumer's floor.
            await self._record_position()
        log.info(
            "plugin_positioned",
            position_key=self.settings.position_key,
            start_seq=plan.start_seq,
            reason=plan.reason,
            recorded=recorded,
        )
        return plan

    async def _old_consumer_floor(self, nc: Connection) -> int | None:
        """Where the durable consumer ``plugin-<name>`` an earlier version read through had everything acknowledged;
        None when there is none (or the server does not say)."""
        try:
            floors = await streams.consumer_floors(nc, self.config.evt_stream)
        except (BusError, TimeoutError) as exc:
            log.warning("plugin_consumer_list_failed", error=repr(exc))
            return None
        return floors.get(CONSUMER_PREFIX + self.name)

    # ---- following the log --------------------------------------------------------------------

    async def _follow(self, nc: Connection) -> None:
        idle_wait = self.settings.poll_s
        while not self._stop.is_set():
            raise_if_cancelling()
            try:
                batch = await log_read.read_batch(
                    nc,
                    self.config.evt_stream,
                    self.position + 1,
                    self.settings.batch,
                    MAX_BATCH_BYTES,
                    subject=self._server_filter,
                )
            except Exception as exc:
                if not retryable(exc):
                    raise
                log.warning("plugin_read_failed", from_seq=self.position + 1, error=repr(exc))
                await wait_event(self._stop, READ_RETRY_S)
                continue
            if batch.messages:
                await self._handle_batch(batch)
                idle_wait = self.settings.poll_s
            if batch.pending > 0:
                continue  # more is stored already: read on at once
            if self._stop.is_set():
                return
            self._note_caught_up()
            await wait_event(self._stop, idle_wait)
            if not batch.messages:
                idle_wait = min(idle_wait * 2, self.settings.max_poll_s)

    async def _handle_batch(self, batch: log_read.Batch) -> None:
        """Hand over the batch's events in order; record the position reached (also when stopping mid-batch, or
        when an event stops the plugin: its position stays before that event)."""
        count = len(batch.messages)
        try:
            for index, stored in enumerate(batch.messages):
                if self._stop.is_set():
                    break
                if self._server_filter is None and not any(matches(stored.subject, s) for s in self.settings.subjects):
                    self.position = stored.seq  # not one of its subjects: done with it
                    continue
                if not await self._handle_event(stored, batch.pending + count - index - 1):
                    break  # stopping while it waited to hand the event over again
                self.position = stored.seq
        except PluginStoppedError:
            await self._record_position()
            raise
        await self._record_position()

    async def _handle_event(self, stored: Stored, pending: int) -> bool:
        """Hand one event over until it is handled or abandoned (True); False when stopped while waiting to hand
        it over again. Raises ``PluginStoppedError`` when its attempts ran out and the policy is to stop."""
        attempts = 0
        while True:
            attempts += 1
            delivery = Delivery(stored.seq, stored.subject, stored.data, attempts, pending)
            try:
                await self.handle_message(delivery)
            except Exception as exc:  # any handler failure means "hand it over again"
                self.failed_attempts += 1
                if attempts < self.settings.max_attempts:
                    wait = backoff(attempts, base=self.settings.backoff_s, cap=self.settings.max_backoff_s)
                    log.warning(
                        "plugin_handler_failed",
                        seq=stored.seq,
                        subject=stored.subject,
                        attempt=attempts,
                        retry_in_s=wait,
                        exc_info=exc,
                    )
                    if await wait_event(self._stop, wait):
                        return False  # the event is the first one the next run hands over
                    continue
                if self.settings.on_exhausted == "stop":
                    log.error(
                        "plugin_event_failed_stopping",
                        seq=stored.seq,
                        subject=stored.subject,
                        attempts=attempts,
                        exc_info=exc,
                    )
                    raise PluginStoppedError(self.name, stored.seq, attempts, exc) from exc
                await self._abandon(delivery, attempts, exc)
                self.last_seq = max(self.last_seq, stored.seq)
                return True
            crash_point("plugin_handled")
            self.last_seq = max(self.last_seq, stored.seq)
            self.handled += 1
            return True

    async def _record_position(self) -> None:
        """Record the position in the marks when it moved; a failure is logged (the events since the last record
        are handed over again after a restart, or recorded with the next batch)."""
        if self.position == self.recorded:
            return
        assert self.marks is not None
        seq = self.position
        try:
            await self.marks.record_position(seq)
        except (BusError, TimeoutError) as exc:
            log.warning("plugin_position_not_recorded", position=seq, error=repr(exc))
            return
        self.recorded = seq

    def _note_caught_up(self) -> None:
        if not self.caught_up.is_set():
            self.caught_up.set()
            log.info("plugin_caught_up", last_seq=self.last_seq, position=self.position, handled=self.handled)

    async def _abandon(self, delivery: Delivery, attempts: int, exc: Exception) -> None:
        self.abandoned += 1
        log.error(
            "plugin_event_abandoned",
            seq=delivery.seq,
            subject=delivery.subject,
            attempts=attempts,
            error=repr(exc),
            record=f"{self._bucket} {self.name}.dead.{delivery.seq}",
        )
        record = _ENCODER.encode(
            {"seq": delivery.seq, "subject": delivery.subject, "attempts": attempts, "error": repr(exc)}
        )
        assert self.marks is not None
        try:
            await self.marks.record_dead(delivery.seq, record)
        except (BusError, TimeoutError) as err:
            log.error("plugin_abandoned_record_failed", seq=delivery.seq, error=repr(err))

    def status(self) -> dict[str, Any]:
        return {
            "plugin": self.name,
            "position_key": self.settings.position_key,
            "connected": bool(self.nc and self.nc.is_connected),
            "caught_up": self.caught_up.is_set(),
            "last_seq": self.last_seq,
            "position": self.position,
            "handled": self.handled,
            "failed_attempts": self.failed_attempts,
            "abandoned": self.abandoned,
            "undecodable": self.undecodable,
            "unknown": self.unknown,
        }
