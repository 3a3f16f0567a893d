"""The run skeleton every long-running process on NATS shares (the services' base, the plugin SDK).

``run()`` connects (retrying until NATS answers, unless stopped first), runs the process's body on the connection
and closes it on the way out, whatever happened. ``in_task_group`` runs the body's loops in one
``asyncio.TaskGroup`` and re-raises the error that ended it as itself, never as a group of one. ``shutdown()``
is idempotent and safe before ``run()``. Cancellation is never swallowed.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog

from shared.bus.connection import Connection, close_quietly, connect_unless_stopped
from shared.core.aio import raise_if_cancelling
from shared.core.config import TownConfig


def stop_on_signals(shutdown: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Call ``shutdown()`` on SIGTERM and SIGINT (a process's entry point, inside its event loop): the process
    finishes what it has in hand, ``run()`` returns and the process exits."""
    loop = asyncio.get_running_loop()
    stopping: set[asyncio.Task[None]] = set()

    def on_signal() -> None:
        task = loop.create_task(shutdown())
        stopping.add(task)
        task.add_done_callback(stopping.discard)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)


class _ShutdownRequestedError(Exception):
    """Raised inside the task group to unwind it when shutdown() is called."""


class _FinishedError(Exception):
    """Raised in the task group's body once it returned, to stop the loops it started."""


class Lifecycle:
    """One process's run: started once, stopped by ``shutdown()`` or by the error it re-raises."""

    def __init__(self, config: TownConfig, *, label: str, client_name: str, log_context: dict[str, str]) -> None:
        """``label`` names it in errors (``mayor``, ``plugin archiver``); ``client_name`` is its NATS connection's
        name; ``log_context`` is bound to every log line while it runs."""
        self.config = config
        self.label = label
        self.client_name = client_name
        self.log_context = log_context
        self.stopping = asyncio.Event()
        """Set by ``shutdown()``."""
        self._started = False

    def shutdown(self) -> None:
        """Ask ``run()`` to stop; returns at once. Safe to call any number of times, also before ``run()``."""
        self.stopping.set()

    async def run(self, body: Callable[[Connection], Awaitable[None]]) -> None:
        """Connect and run ``body`` on the connection until it returns or raises (re-raised); the connection is
        closed on the way out. Returns at once when stopped before it connected."""
        if self._started:
            raise RuntimeError(f"{self.label} already ran")
        self._started = True
        if self.stopping.is_set():
            return
        with structlog.contextvars.bound_contextvars(**self.log_context):
            nc = await connect_unless_stopped(self.config, self.client_name, self.stopping)
            if nc is None:
                raise_if_cancelling()
                return
            try:
                await body(nc)
            finally:
                await close_quietly(nc)

    async def in_task_group(
        self,
        body: Callable[[asyncio.TaskGroup], Awaitable[None]],
        *,
        stop_cancels: bool,
        first: tuple[type[BaseException], ...] = (),
    ) -> None:
        """Run ``body`` in one task group with the loops it starts there. The group ends when ``body`` returns
        (its loops are cancelled), when one of them fails (that error is re-raised, a ``first`` one before any
        other: several tasks may notice one cause at once), or, with ``stop_cancels``, at ``shutdown()``: then
        everything in it is cancelled and this returns. Without ``stop_cancels`` the body watches ``stopping``
        itself (to finish what it has in hand)."""
        try:
            async with asyncio.TaskGroup() as tg:
                if stop_cancels:
                    tg.create_task(self._stop_watch(), name="stop-watch")
                await body(tg)
                raise _FinishedError
        except BaseExceptionGroup as group:
            errors = [e for e in group.exceptions if not isinstance(e, _ShutdownRequestedError | _FinishedError)]
            preferred = [e for e in errors if isinstance(e, first)]
            if preferred:
                raise preferred[0] from group
            if len(errors) == 1:
                # The error itself, not a group of one, so callers see what failed.
                raise errors[0] from group
            if errors:
                raise

    async def _stop_watch(self) -> None:
        await self.stopping.wait()
        raise _ShutdownRequestedError
