"""Connections kept from one call to the next: a client helper's worker (gt/cli/helper.py) runs ``gt`` call after
call, and connecting anew for each (a TCP connection, the server's INFO, CONNECT and a PING answered; inside a
polecat session a login checked by the witness too) cost 1.3 ms of a 15 ms call on a 2-core machine.

Every call runs on the same event loop (``run``, in place of ``asyncio.run``); its connection is lent from those
kept under the same key (servers, login, inbox prefix: ``connection_key``) and given back at its end. A connection
is kept only as it was made: connected, with no subscription but nats-py's own for replies; anything else is
closed. One is never lent when its server closed it meanwhile (read from its socket, without running the loop),
nor after ``CHECK_AFTER_S`` unused without answering a PING; one not used for ``KEEP_IDLE_S`` is closed. After
each call, any task left on the loop that is not a kept connection's own (its reading, flushing, pinging) is
something the call left running: the worker tells its helper it is unfit (``tidy``), as for a thread left running.

The server's own guards stay in force: a polecat session's connection is kicked when the session ends (the
witness, ``shared.bus.auth_callout``), and its next call then logs in afresh and is refused.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from shared.bus.connection import Connection, close_at_once, peer_closed, set_resting, socket_of
from shared.bus.errors import map_errors

log = structlog.get_logger(__name__)

T = TypeVar("T")

KEEP_IDLE_S = 30.0
"""How long a kept connection waits for its next call before it is closed."""
CHECK_AFTER_S = 1.0
"""A kept connection unused for longer is asked for a PONG before it is lent: a server cut off without closing
the connection (a partition, a host gone) leaves nothing on the socket to see, and a call on such a connection
would wait out its timeouts where a fresh connection finds a live server at once."""
CHECK_TIMEOUT_S = 1
"""How long that PONG may take; a connection that does not answer in time is dropped for a fresh one."""
STRAY_TASKS_WAIT_S = 5.0
"""How long the tasks a call left running are given to end once cancelled."""


class _Kept:
    __slots__ = ("last_used", "nc")

    def __init__(self, nc: Connection, last_used: float) -> None:
        self.nc, self.last_used = nc, last_used


class KeptConnections:
    """One event loop for a process's calls, and the connections they made, for the next call to use."""

    def __init__(self, *, keep_idle_s: float = KEEP_IDLE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._runner = asyncio.Runner()
        self._runner.get_loop()  # made now: its descriptors are the process's own, not a call's
        self._keep_idle_s = keep_idle_s
        self._clock = clock
        self._kept: dict[Hashable, _Kept] = {}
        self._lent: dict[Connection, Hashable] = {}
        self.made = 0
        """Connections made (not lent from those kept)."""

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """``asyncio.run(main)``, on the loop the kept connections live on: Ctrl-C cancels ``main`` as there, and
        ``main`` runs in a context of its own (no call meets another's context variables) with an executor of its
        own (shut down at its end: no thread outlives the call)."""
        loop = self._runner.get_loop()
        executor = ThreadPoolExecutor(thread_name_prefix="gt-call")
        loop.set_default_executor(executor)
        try:
            return self._runner.run(main, context=contextvars.copy_context())
        finally:
            executor.shutdown(wait=True, cancel_futures=True)

    @map_errors
    async def connect(self, key: Hashable, make: Callable[[], Awaitable[Connection]]) -> Connection:
        """The connection kept under ``key`` while it is still connected, else a fresh one from ``make``."""
        kept = self._kept.pop(key, None)
        if kept is not None:
            # Its socket as it is now: nats-py replaces it when it reconnects (during another call, say).
            fd = socket_of(kept.nc)
            if kept.nc.is_connected and fd is not None and not peer_closed(fd) and await self._answers(kept):
                log.debug("nats_connection_reused")
                set_resting(kept.nc, False)
                self._lent[kept.nc] = key
                return kept.nc
            await close_at_once(kept.nc, within_s=CHECK_TIMEOUT_S)
        nc = await make()
        self.made += 1
        self._lent[nc] = key
        return nc

    @map_errors
    async def give_back(self, nc: Connection) -> None:
        """The call is done with ``nc``: kept for the next one when it is as it was made, else closed."""
        key = self._lent.pop(nc)
        if socket_of(nc) is None or not nc.is_connected or _subscribed(nc) or key in self._kept:
            await close_at_once(nc)
            return
        set_resting(nc, True)
        self._kept[key] = _Kept(nc, self._clock())
        log.debug("nats_connection_kept")

    async def _answers(self, kept: _Kept) -> bool:
        """Whether ``kept``'s server answers a PING (asked only after ``CHECK_AFTER_S`` unused)."""
        if self._clock() - kept.last_used <= CHECK_AFTER_S:
            return True
        try:
            await kept.nc.flush(timeout=CHECK_TIMEOUT_S)
        except (TimeoutError, nats.errors.Error):
            return False
        return True

    def fds(self) -> frozenset[str]:
        """The kept connections' socket descriptors (as /proc/self/fd names them)."""
        return frozenset(str(fd) for kept in self._kept.values() if (fd := socket_of(kept.nc)) is not None)

    def tidy(self) -> bool:
        """After a call: whether the loop holds nothing but the kept connections' own tasks. Anything else the call
        left running is cancelled and every connection closed; False then (the process is unfit for another)."""
        loop = self._runner.get_loop()
        kept = {k.nc for k in self._kept.values()}
        stray = [task for task in asyncio.all_tasks(loop) if _client_of(task) not in kept]
        if not stray and not self._lent:
            return True
        for task in stray:
            task.cancel()
        self._runner.run(self._close_all(stray))
        return False

    def expire(self) -> None:
        """Close the connections not used for ``KEEP_IDLE_S`` (between calls: nothing runs on the loop then)."""
        now = self._clock()
        old = [key for key, kept in self._kept.items() if now - kept.last_used >= self._keep_idle_s]
        if old:
            self._runner.run(self._close([self._kept.pop(key).nc for key in old]))

    def close(self) -> None:
        """Close every connection and the loop."""
        self._runner.run(self._close_all([]))
        self._runner.close()

    async def _close_all(self, stray: list[asyncio.Task[Any]]) -> None:
        lent, self._lent = list(self._lent), {}
        await self._close([kept.nc for kept in self._kept.values()] + lent)
        self._kept.clear()
        if stray:
            await asyncio.wait(stray, timeout=STRAY_TASKS_WAIT_S)

    @staticmethod
    async def _close(connections: list[Connection]) -> None:
        await asyncio.gather(*(close_at_once(nc) for nc in connections))


def _subscribed(nc: Connection) -> bool:
    """Whether ``nc`` holds a subscription the call made (a watch, a consumer), beside nats-py's own for replies.
    Read from nats-py's private state; a version that keeps it elsewhere has its connections closed, not kept."""
    prefix = getattr(nc, "_resp_sub_prefix", None)  # the reply subscription's subject, "<inbox>.<nuid>."
    subs = getattr(nc, "_subs", None)
    if not isinstance(subs, dict):
        return True
    replies = prefix.decode() if isinstance(prefix, bytes | bytearray) and prefix else None
    return any(not (replies and getattr(sub, "subject", "").startswith(replies)) for sub in subs.values())


def _client_of(task: asyncio.Task[Any]) -> Client | None:
    """The nats-py client whose machinery ``task`` runs (its reading, flushing, pinging, a subscription's
    deliveries); None for any other task."""
    frame = getattr(task.get_coro(), "cr_frame", None)
    owner = frame.f_locals.get("self") if frame is not None else None
    if isinstance(owner, Subscription):
        owner = getattr(owner, "_conn", None)
    return owner if isinstance(owner, Client) else None
