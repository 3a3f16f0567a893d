"""Pull requests on a durable consumer that always finish before the plugin acts on what they brought.

nats-py's ``fetch`` can leave a lingering request on the server that delivers later, behind the caller's
back; a plugin that then asks for redelivery of a failed event would get newer events first. Here each
request has its own reply subject and ends in a known way: its batch is full, or the server says there is
nothing more (404, 408). Only a request the server stopped answering (a lost connection) is abandoned; if
it delivers after all, those events are handed back at once (nak) so they come again, first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

import nats.errors
import structlog
from nats.aio.msg import Msg

from shared.aio import pause
from shared.bus.connection import Connection
from shared.errors import GastownError

log = structlog.get_logger(__name__)

NO_WAIT_ANSWER_S = 5.0
"""A no-wait request is answered at once; silence this long means the request or its answer was lost."""
STALE_SUBSCRIPTION_S = 5.0
"""How long an abandoned request's subscription stays to hand back late deliveries, past its expiry."""


class ConsumerGoneError(GastownError):
    """The plugin's consumer was deleted under it (another process replayed the plugin, or an operator)."""

    def __init__(self, stream: str, consumer: str, detail: str) -> None:
        self.stream = stream
        self.consumer = consumer
        super().__init__(
            f"consumer {consumer} on {stream} is gone ({detail}); is a second process running this plugin? "
            "Restart the plugin: it recreates its consumer"
        )


class PullFailedError(GastownError):
    def __init__(self, consumer: str, status: str, detail: str) -> None:
        self.consumer = consumer
        self.status = status
        super().__init__(f"pull request on consumer {consumer} refused: {status} {detail}")


class _Request:
    __slots__ = ("batch", "queue", "stale", "sub")

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.queue: asyncio.Queue[Msg] = asyncio.Queue()
        self.stale = False
        self.sub: Any = None


class Puller:
    """Fetches batches from one durable pull consumer, one complete request at a time."""

    def __init__(
        self,
        nc: Connection,
        stream: str,
        consumer: str,
        *,
        batch: int,
        long_poll_s: float,
        idle_heartbeat_s: float,
        on_idle: Callable[[], None] = lambda: None,
    ) -> None:
        self._nc = nc
        self._consumer = consumer
        self._stream = stream
        self._api = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._batch = batch
        self._long_poll_s = long_poll_s
        self._heartbeat_s = idle_heartbeat_s
        self._on_idle = on_idle
        self._inbox = nc.new_inbox()
        self._token = 0
        self._stale_tasks: set[asyncio.Task[None]] = set()
        self.stale_deliveries = 0
        self.abandoned = 0

    async def next_batch(self) -> list[Msg]:
        """Events available now (up to the batch size), else the next one to arrive within the long poll;
        [] when none came."""
        msgs = await self._request({"batch": self._batch, "no_wait": True}, self._batch, NO_WAIT_ANSWER_S)
        if msgs:
            return msgs
        self._on_idle()  # the consumer had nothing left: caught up
        body = {
            "batch": 1,
            "expires": int(self._long_poll_s * 1e9),
            "idle_heartbeat": int(self._heartbeat_s * 1e9),
        }
        return await self._request(body, 1, self._heartbeat_s * 3)

    async def close(self) -> None:
        for task in list(self._stale_tasks):
            task.cancel()
        for task in list(self._stale_tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _request(self, body: dict[str, Any], batch: int, silence_s: float) -> list[Msg]:
        self._token += 1
        req = _Request(batch)

        async def on_msg(msg: Msg) -> None:
            if not req.stale:
                req.queue.put_nowait(msg)
            elif msg.reply:
                # A delivery for a request we gave up on: hand it back so it is redelivered, first.
                self.stale_deliveries += 1
                with contextlib.suppress(nats.errors.Error):
                    await msg.nak()

        reply = f"{self._inbox}.{self._token}"
        req.sub = await self._nc.subscribe(reply, cb=on_msg)
        finished = False
        try:
            await self._nc.publish(self._api, json.dumps(body).encode(), reply=reply)
            msgs, finished = await self._collect(req, silence_s)
            return msgs
        finally:
            if finished:
                with contextlib.suppress(nats.errors.Error):
                    await req.sub.unsubscribe()
            else:
                req.stale = True
                self.abandoned += 1
                while not req.queue.empty():
                    left = req.queue.get_nowait()
                    if left.reply:
                        with contextlib.suppress(nats.errors.Error):
                            await left.nak()
                self._linger(req)

    async def _collect(self, req: _Request, silence_s: float) -> tuple[list[Msg], bool]:
        """(messages, finished): finished means the server will deliver nothing more for this request."""
        msgs: list[Msg] = []
        while len(msgs) < req.batch:
            try:
                async with asyncio.timeout(silence_s):
                    msg = await req.queue.get()
            except TimeoutError:
                log.warning("plugin_pull_unanswered", consumer=self._consumer, received=len(msgs))
                return msgs, False
            status = (msg.headers or {}).get("Status") if not msg.reply else None
            if status is None:
                msgs.append(msg)
                continue
            description = str((msg.headers or {}).get("Description", ""))
            if status == "100":
                continue  # idle heartbeat: the request is alive
            if status in ("404", "408"):
                return msgs, True  # nothing more now / the long poll expired
            if status == "409" and "deleted" in description.lower():
                raise ConsumerGoneError(self._stream, self._consumer, description)
            if status == "409" and "leadership" in description.lower():
                return msgs, True  # the request died with the old leader; ask again
            if status == "503":
                log.warning("plugin_pull_no_jetstream", consumer=self._consumer)
                await pause(0.5)
                return msgs, True
            raise PullFailedError(self._consumer, status, description)
        return msgs, True

    def _linger(self, req: _Request) -> None:
        async def unsubscribe_later() -> None:
            await pause(self._long_poll_s + STALE_SUBSCRIPTION_S)
            with contextlib.suppress(nats.errors.Error):
                await req.sub.unsubscribe()

        task = asyncio.get_running_loop().create_task(unsubscribe_later())
        self._stale_tasks.add(task)
        task.add_done_callback(self._stale_tasks.discard)
