"""asyncio helpers that keep cancellation intact on Python 3.11.

``asyncio.wait_for`` on 3.11 returns the inner result, swallowing the cancellation, when the task is
cancelled in the same loop iteration as the awaited thing completes (fixed in 3.12). A long-running loop
that loses its one cancellation then runs forever and its TaskGroup never finishes shutting down. This
project waits with ``asyncio.timeout`` instead, and its loops also check ``raise_if_cancelling`` at the
top, because libraries it calls (nats-py's request, for one) still use ``wait_for``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait up to ``timeout`` seconds (None: no limit) for ``event``; True when it is set. Raises a cancellation
    that a library swallowed earlier, like ``pause``."""
    raise_if_cancelling()
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True


def raise_if_cancelling() -> None:
    """Raise CancelledError when the current task was asked to stop but a library swallowed the request."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def pause(seconds: float) -> None:
    """``asyncio.sleep`` for the wait between a loop's rounds: it first raises a cancellation that a library
    swallowed during the round, so a loop never outlives the cancel meant to end it."""
    raise_if_cancelling()
    await asyncio.sleep(seconds)


def task_stacks(limit: int = 12) -> list[str]:
    """The stack of every task of the running loop: what a process that does not stop is waiting for."""
    dumps = []
    for task in asyncio.all_tasks():
        out = io.StringIO()
        task.print_stack(limit=limit, file=out)
        dumps.append(out.getvalue())
    return dumps


class KeyedLocks:
    """An ``asyncio.Lock`` per key, made at first use and forgotten once nobody holds or waits for it (a
    long-running service locks ever new keys: worktree paths)."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._users[key] -= 1
            if not self._users[key]:
                del self._users[key], self._locks[key]

    def __len__(self) -> int:
        """Keys locked or waited for now."""
        return len(self._locks)
