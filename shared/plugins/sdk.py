"""The plugin SDK: a named, durable, ordered, at-least-once reader of ``GT_EVT`` with typed events.

A plugin named N reads through the durable pull consumer ``plugin-N`` and so resumes where it left off.
Its handler gets ``(seq, envelope, payload)`` one event at a time, in stream order; the payload is None
for a type this code does not know (logged, then acknowledged like any other). An event is acknowledged
only after the handler returned. A handler that raises gets the event again after a bounded backoff, and
no later event is handed over before it succeeds; after ``max_attempts`` failures the plugin either stops
(the event stays unacknowledged) or records the event as abandoned and goes on (``on_exhausted``).
Delivery is at-least-once: ``once`` (marks in the ``GT_PLUGINS`` bucket) makes side effects exactly-once.

``run()`` blocks until ``shutdown()`` or a fatal error, which it re-raises; ``shutdown()`` is idempotent
and safe before ``run()``: the run skeleton is the services' (``shared.service.lifecycle``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, NamedTuple

import msgspec
import structlog

from shared.aio import pause, raise_if_cancelling, wait_event
from shared.bus import consumer as bus_consumer
from shared.bus import kv, streams
from shared.bus.connection import Connection
from shared.bus.consumer import Message
from shared.bus.errors import RETRYABLE_ERRORS, BusError
from shared.bus.pull import Puller
from shared.config import TownConfig
from shared.errors import EventDecodeError, GastownError, UnknownEventTypeError
from shared.events import REGISTRY, Envelope, Event, EventRegistry, decode_envelope
from shared.faults import crash_point
from shared.plugins.marks import Claim, Marks, retrying
from shared.plugins.position import ConsumerPosition, StartPlan, plan_start
from shared.plugins.settings import PLUGIN_BUCKET, PluginSettings, backoff, validate
from shared.service.lifecycle import Lifecycle
from shared.subjects import parse_js_reply

log = structlog.get_logger(__name__)

Handler = Callable[[int, Envelope, Event | None], Awaitable[None]]
"""``(stream sequence, envelope, typed payload or None)``; raise to have the event delivered again."""
_ENCODER = msgspec.json.Encoder()


class Delivery(NamedTuple):
    """One event as the server delivered it."""

    seq: int
    subject: str
    data: bytes
    """The stored bytes (the JSON envelope, unless a foreign writer stored something else)."""
    delivered: int
    """How many times the server has delivered it to this consumer (1: the first time)."""
    pending: int
    """Events left for the consumer after this one."""


class PluginStoppedError(GastownError):
    """An event kept failing and the plugin's policy is to stop rather than pass over it."""

    def __init__(self, plugin: str, seq: int, attempts: int, error: BaseException) -> None:
        self.plugin = plugin
        self.seq = seq
        self.attempts = attempts
        super().__init__(
            f"plugin {plugin} stopped: event {seq} failed {attempts} times (last error: {error!r}); it stays "
            "unacknowledged and is the first event handled when the plugin starts again"
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
        """Set once the consumer is in place and events are being fetched."""
        self.caught_up = asyncio.Event()
        """Set the first time the plugin has handled everything its consumer had (nothing more to fetch)."""
        self.start_plan: StartPlan | None = None
        self.last_seq = 0
        """Stream sequence of the last event this process handled and acknowledged."""
        self.handled = 0
        self.failed_attempts = 0
        self.abandoned = 0
        self.undecodable = 0
        self.unknown = 0
        self.lifecycle = Lifecycle(
            config, label=f"plugin {self.name}", client_name=f"gt-plugin-{self.name}", log_context={"plugin": self.name}
        )
        self._stop = self.lifecycle.stopping
        self._failures: dict[int, int] = {}
        self._held: deque[Message] = deque()
        self._reported: set[str] = set()

    # ---- hooks --------------------------------------------------------------------------------

    async def handle(self, seq: int, env: Envelope, payload: Event | None) -> None:
        """Act on one event. Raise to have it delivered again (after a backoff)."""
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
        """Called once connected, before the consumer is positioned (open files, load state)."""

    async def resume_after(self) -> int | None:
        """The last stream sequence this plugin holds by its own records, if it keeps any: the consumer
        is moved to deliver from the next one. None: the consumer's position is the record."""
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
        """Consume until ``shutdown()``; re-raises the error that made the plugin stop otherwise."""
        await self.lifecycle.run(self._run_connected)

    async def _run_connected(self, nc: Connection) -> None:
        self.nc = nc
        if not await self._wait_for_stream(nc):
            return
        bucket = await kv.open_or_create(
            nc, self._bucket, ttl_s=self.settings.mark_ttl_s, replicas=self.config.replicas
        )
        self.marks = Marks(bucket, self.name)
        await self.prepare()
        try:
            self.start_plan = await self._position(nc)
            puller = Puller(
                nc,
                self.config.evt_stream,
                self.settings.consumer,
                batch=self.settings.batch,
                long_poll_s=self.settings.long_poll_s,
                idle_heartbeat_s=self.settings.idle_heartbeat_s,
                on_idle=self._note_caught_up,
            )

            async def consume(tg: asyncio.TaskGroup) -> None:
                tg.create_task(self._keepalive(), name="keepalive")
                self.start_background(tg)
                self.ready.set()
                await self._consume(puller)

            try:
                # Not cancelled at shutdown(): consuming stops after the event in hand, then the group ends.
                await self.lifecycle.in_task_group(consume, stop_cancels=False)
            finally:
                await puller.close()
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
            except RETRYABLE_ERRORS as exc:
                log.warning("plugin_stream_info_failed", error=repr(exc))
            await wait_event(self._stop, 1.0)
        return False

    async def _position(self, nc: Connection) -> StartPlan:
        stream, consumer = self.config.evt_stream, self.settings.consumer

        async def info() -> ConsumerPosition | None:
            found = await bus_consumer.consumer_state(nc, stream, consumer)
            return ConsumerPosition(*found) if found is not None else None

        existing = await retrying("consumer_info", info)
        resume = await self.resume_after()
        plan = plan_start(
            existing, subjects=self.settings.subjects, replay=self.settings.replay_from_start, resume_after=resume
        )
        if plan.action == "recreate":
            await retrying("delete_consumer", lambda: bus_consumer.delete_consumer(nc, stream, consumer))
        if plan.action != "keep":
            await retrying(
                "add_consumer",
                lambda: bus_consumer.create_event_consumer(
                    nc,
                    stream,
                    consumer,
                    filters=self.settings.subjects,
                    start_seq=plan.start_seq,
                    ack_wait_s=self.settings.ack_wait_s,
                    max_ack_pending=max(1_000, self.settings.batch * 4),
                    replicas=self.config.replicas,
                ),
            )
        if self.settings.replay_from_start:
            assert self.marks is not None
            await self.marks.purge()
        log.info(
            "plugin_consumer_ready",
            consumer=consumer,
            action=plan.action,
            start_seq=plan.start_seq if plan.action != "keep" else None,
            reason=plan.reason,
            previous=existing._asdict() if existing else None,
        )
        return plan

    # ---- consuming ----------------------------------------------------------------------------

    async def _consume(self, puller: Puller) -> None:
        stopping = asyncio.ensure_future(self._stop.wait())
        try:
            while not self._stop.is_set():
                raise_if_cancelling()
                pulling = asyncio.ensure_future(puller.next_batch())
                await asyncio.wait({pulling, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not pulling.done():
                    pulling.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await pulling
                    raise_if_cancelling()
                    return
                batch = pulling.result()
                if batch:
                    await self._handle_batch(batch)
        finally:
            stopping.cancel()

    async def _handle_batch(self, batch: list[Message]) -> None:
        held = self._held = deque(batch)
        try:
            while held:
                if self._stop.is_set():
                    await self._hand_back(held)
                    return
                msg = held[0]
                info = parse_js_reply(msg.reply)
                delivery = Delivery(info.stream_seq, msg.subject, msg.data, info.delivered, info.pending)
                try:
                    await self.handle_message(delivery)
                except Exception as exc:  # noqa: BLE001 - any handler failure means "deliver it again"
                    if await self._failed(delivery, exc, held):
                        continue
                    return
                self._failures.pop(delivery.seq, None)
                crash_point("plugin_handled")
                held.popleft()
                await bus_consumer.ack(msg)  # a lost acknowledgement only means one more delivery
                self.last_seq = max(self.last_seq, delivery.seq)
                self.handled += 1
                if delivery.pending == 0:
                    self._note_caught_up()
        finally:
            self._held = deque()

    def _note_caught_up(self) -> None:
        if not self.caught_up.is_set():
            self.caught_up.set()
            log.info("plugin_caught_up", last_seq=self.last_seq, handled=self.handled)

    async def _failed(self, delivery: Delivery, exc: Exception, held: deque[Message]) -> bool:
        """True when the event was passed over and the batch goes on; False when the batch was handed
        back (to be delivered again after the backoff)."""
        seq = delivery.seq
        failures = self._failures[seq] = self._failures.get(seq, 0) + 1
        self.failed_attempts += 1
        if failures < self.settings.max_attempts:
            wait = backoff(failures, base=self.settings.backoff_s, cap=self.settings.max_backoff_s)
            log.warning(
                "plugin_handler_failed",
                seq=seq,
                subject=delivery.subject,
                attempt=failures,
                delivered=delivery.delivered,
                retry_in_s=wait,
                exc_info=exc,
            )
            # Wait here rather than with a delayed nak: nothing newer may be fetched before this event
            # comes again, and a nak without delay puts it first in line.
            await wait_event(self._stop, wait)
            await self._hand_back(held)
            return False
        if self.settings.on_exhausted == "stop":
            log.error(
                "plugin_event_failed_stopping", seq=seq, subject=delivery.subject, attempts=failures, exc_info=exc
            )
            await self._hand_back(held)
            raise PluginStoppedError(self.name, seq, failures, exc) from exc
        await self._abandon(held.popleft(), delivery, failures, exc)
        return True

    async def _abandon(self, msg: Message, delivery: Delivery, attempts: int, exc: Exception) -> None:
        self._failures.pop(delivery.seq, None)
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
        await bus_consumer.term(msg)

    async def _hand_back(self, held: deque[Message]) -> None:
        """Nak every held event, oldest first, and wait until the server has them all: the next pull then
        gets them back in stream order, before anything newer."""
        msgs = sorted(held, key=lambda m: parse_js_reply(m.reply).stream_seq)
        held.clear()
        if not msgs:
            return
        assert self.nc is not None
        try:
            await bus_consumer.hand_back(self.nc, msgs)
        except (BusError, TimeoutError) as exc:
            # They come back after their ack wait instead (and at once after a restart).
            log.warning("plugin_hand_back_failed", events=len(msgs), error=repr(exc))

    async def _keepalive(self) -> None:
        # Tell the server the held events are being worked on, so a slow handler or a backoff never
        # makes them due for redelivery behind the plugin's back.
        interval = self.settings.ack_wait_s / 3
        while True:
            await pause(interval)
            for msg in list(self._held):
                await bus_consumer.in_progress(msg)

    def status(self) -> dict[str, Any]:
        return {
            "plugin": self.name,
            "consumer": self.settings.consumer,
            "connected": bool(self.nc and self.nc.is_connected),
            "caught_up": self.caught_up.is_set(),
            "last_seq": self.last_seq,
            "handled": self.handled,
            "failed_attempts": self.failed_attempts,
            "abandoned": self.abandoned,
            "undecodable": self.undecodable,
            "unknown": self.unknown,
        }
