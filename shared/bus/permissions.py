"""Permission violations the NATS server reports on a connection, made visible.

A publish or subscription the connection's user may not make is refused by the server with an ``-ERR`` that
nats-py hands only to the connection's error callback (``permissions violation for publish to "gt.evt.x"``);
a JetStream publish to that subject then just waits for an acknowledgement that never comes. ``connect``
records each refusal here, per client, and ``guarded`` turns one into ``PermissionDeniedError`` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import weakref
from collections.abc import Awaitable
from typing import TypeVar

import nats.errors
from nats.aio.client import Client

from shared.bus.errors import map_errors
from shared.core.errors import PermissionDeniedError

T = TypeVar("T")

_VIOLATION = re.compile(
    r'permissions violation for (publish|subscription)(?: with reply of| to) "([^"]*)"', re.IGNORECASE
)
FLUSH_TIMEOUT_S = 2
_API_TOKENS = {
    token.lower(): token
    for token in (
        "$JS", "$KV", "$O", "API", "ACK", "FC", "INFO", "STREAM", "CONSUMER", "NAMES", "LIST", "CREATE", "UPDATE",
        "DELETE", "PURGE", "MSG", "GET", "NEXT", "DIRECT", "DURABLE", "LEADER", "STEPDOWN", "SNAPSHOT", "RESTORE",
        "PEER", "REMOVE", "PAUSE", "RESET", "UNPIN",
    )
}  # fmt: skip
_TOWN_NAME = re.compile(r"(kv_|obj_)?gt_[a-z0-9_]+")


def restore_case(subject: str) -> str:
    """nats-py lowercases the server's error messages. Subjects of ours are lowercase anyway; JetStream's name
    the API and the town's streams and buckets in capitals (``$JS.API.STREAM.DELETE.GT_EVT``): put those back."""
    if not subject.startswith("$"):
        return subject
    tokens = subject.split(".")
    return ".".join(_API_TOKENS.get(t) or (t.upper() if _TOWN_NAME.fullmatch(t) else t) for t in tokens)


def parse_violation(message: str, user: str) -> PermissionDeniedError | None:
    """The refusal an error message of the server describes, or None when it is not a permission violation."""
    found = _VIOLATION.search(message)
    if found is None:
        return None
    operation = "publish" if found.group(1).lower() == "publish" else "subscribe"
    return PermissionDeniedError(restore_case(found.group(2)), user, operation)


class PermissionWatch:
    """The refusals one connection received, in order, and who is waiting to hear of the next one."""

    def __init__(self, user: str) -> None:
        self.user = user
        self.denied: list[PermissionDeniedError] = []
        self._waiters: set[asyncio.Future[None]] = set()

    def record(self, error: Exception) -> PermissionDeniedError | None:
        """Note ``error`` if it is a permission violation (and wake whoever waits); else None."""
        denied = parse_violation(str(error), self.user)
        if denied is None:
            return None
        self.denied.append(denied)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        return denied

    def since(self, mark: int, subject: str | None = None) -> PermissionDeniedError | None:
        """The first refusal recorded after the first ``mark`` ones; with ``subject``, only one of it, named as
        the caller spells it (the server's message arrives lowercased)."""
        for denied in self.denied[mark:]:
            if subject is None:
                return denied
            if denied.subject.lower() == subject.lower():
                return PermissionDeniedError(subject, denied.user, denied.operation)
        return None

    @map_errors
    async def next_refusal(self) -> None:
        """Returns once another refusal is recorded."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            await waiter
        finally:
            self._waiters.discard(waiter)


_WATCHES: weakref.WeakKeyDictionary[Client, PermissionWatch] = weakref.WeakKeyDictionary()


def register(nc: Client, watch: PermissionWatch) -> None:
    _WATCHES[nc] = watch


def watch_of(nc: Client) -> PermissionWatch | None:
    """The watch ``connect`` set up for ``nc``; None for a client made some other way."""
    return _WATCHES.get(nc)


async def guarded(nc: Client, op: Awaitable[T], *, subject: str | None = None) -> T:
    """Await ``op``, but raise ``PermissionDeniedError`` as soon as the server refuses something on ``nc``
    meanwhile (only a refusal of ``subject``, when given), instead of waiting for ``op``'s timeout.

    Once ``op`` is done a flush (PING, PONG) makes sure the server's answer to whatever ``op`` sent has
    arrived, so a refused core publish, which returns at once, is caught too.
    """
    watch = watch_of(nc)
    if watch is None:
        return await op
    mark = len(watch.denied)
    task = asyncio.ensure_future(op)
    try:
        while not task.done():
            refused = watch.since(mark, subject)
            if refused is not None:
                raise refused
            signal = asyncio.ensure_future(watch.next_refusal())
            try:
                await asyncio.wait({task, signal}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                signal.cancel()
        if not task.cancelled() and task.exception() is None and nc.is_connected:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await nc.flush(timeout=FLUSH_TIMEOUT_S)
        refused = watch.since(mark, subject)
        if refused is not None:
            raise refused
        return task.result()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
