"""Test helpers: poll for a condition with a deadline instead of sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import nats
import psutil
from nats.aio.client import Client

from shared.bus.connection import close_quietly
from shared.service import Service

T = TypeVar("T")

DEFAULT_DEADLINE_S = 30.0
LINGERING_AGENTS = {"GT_DONE_EXIT_GRACE": "10"}
"""The environment of a town whose scripted agents sleep on after `gt done` (a pane that exited before it would be
respawned): the witness ends them 10 s after it, not 60, and the test's `gt down --sessions` waits for that."""


class _Retry:
    """The loop ``assert_eventually`` and ``wait_until`` share: an attempt's AssertionError is kept, not raised,
    until the deadline has passed; then the last one is raised (or, when the check only came back falsy, a new one).
    """

    def __init__(self, timeout: float, message: str) -> None:
        self._timeout = timeout
        self._deadline = time.monotonic() + timeout
        self._message = message
        self._last_error: AssertionError | None = None

    @contextlib.contextmanager
    def attempt(self) -> Iterator[None]:
        try:
            yield
            self._last_error = None
        except AssertionError as exc:
            self._last_error = exc

    def give_up_when_late(self) -> None:
        if time.monotonic() >= self._deadline:
            if self._last_error is not None:
                raise self._last_error
            raise AssertionError(self._message or f"condition not met within {self._timeout}s")


async def assert_eventually(
    check: Callable[[], T | Awaitable[T]],
    *,
    timeout: float = DEFAULT_DEADLINE_S,
    interval: float = 0.02,
    message: str = "",
) -> T:
    """Call ``check`` until it returns a truthy value or stops raising AssertionError; return that value.

    Raises the last AssertionError (or a new one) when ``timeout`` passes first.
    """
    retry = _Retry(timeout, message)
    while True:
        with retry.attempt():
            result = check()
            if asyncio.iscoroutine(result) or isinstance(result, Awaitable):
                result = await result
            if result:
                return result
        retry.give_up_when_late()
        await asyncio.sleep(interval)


def wait_until(
    check: Callable[[], T], *, timeout: float = DEFAULT_DEADLINE_S, interval: float = 0.05, message: str = ""
) -> T:
    """Synchronous ``assert_eventually`` for tests that drive subprocesses (also retries AssertionError)."""
    retry = _Retry(timeout, message)
    while True:
        with retry.attempt():
            result = check()
            if result:
                return result
        retry.give_up_when_late()
        time.sleep(interval)


FIRST_CONNECT_S = 60.0


async def connect_within(servers: str | list[str], *, timeout: float = FIRST_CONNECT_S, **options: Any) -> Client:
    """``nats.connect`` with a bound on the first connection. With ``max_reconnect_attempts=-1`` nats-py tries
    the first connection for ever, and pytest-timeout cannot end it: its exception lands in one of the
    client's own tasks, not in the test."""
    try:
        return await asyncio.wait_for(nats.connect(servers, **options), timeout)
    except TimeoutError:
        raise AssertionError(f"no connection to {servers} within {timeout}s") from None


@contextlib.asynccontextmanager
async def connected(url: str) -> AsyncIterator[Client]:
    """A test's own client of the server at ``url``: reconnects forever, closed with a bound at the end."""
    client = await connect_within(url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    try:
        yield client
    finally:
        await close_quietly(client)


def running_with(marker: str) -> list[str]:
    """``pid: command line`` of the live processes whose command line carries ``marker``."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info.get("cmdline") or ())
        if marker in line:
            found.append(f"{proc.pid}: {line[:200]}")
    return found


def gt_run(
    env: dict[str, str], *args: str, timeout: float | None = None, python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    """``gt ARGS`` run as a user runs it (by ``python``, this test's unless given), with ``env``: its exit status and
    output, whatever the status."""
    return subprocess.run(
        [python, "-m", "gt.cli.main", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


async def started(service: Service[Any], *, name: str = "service", timeout: float = 30) -> asyncio.Task[None]:
    """``service`` running in a task of this loop, once it is ready; its failure before that is raised here."""
    task = asyncio.create_task(service.run(), name=name)
    ready = asyncio.ensure_future(service.ready.wait())
    await asyncio.wait({ready, task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    ready.cancel()
    if task.done():
        task.result()
        raise AssertionError(f"the {name} stopped before it was ready")
    assert service.ready.is_set(), f"the {name} did not become ready within {timeout:g} s"
    return task


@contextlib.asynccontextmanager
async def serving(service: Service[Any], *, name: str = "service") -> AsyncIterator[asyncio.Task[None]]:
    """``service`` running (``started``) for the block, then shut down and its task awaited."""
    task = await started(service, name=name)
    try:
        yield task
    finally:
        await service.shutdown()
        await asyncio.wait_for(task, 30)
