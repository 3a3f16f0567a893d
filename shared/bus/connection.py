"""Connecting to NATS with reconnects that never give up, and mapping connect failures to our errors.

``Connection`` is what every port of the bus takes: code outside ``shared/bus`` holds one and hands it to the
bus, never reaching into it (docs/architecture.md, "Where things are").
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import time
import weakref
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, TypeAlias

import nats
import structlog
from nats.aio.client import Client

from shared.bus.errors import map_errors
from shared.bus.nats_import import websockets_for
from shared.bus.permissions import PermissionWatch, register
from shared.core.aio import pause
from shared.core.config import TownConfig
from shared.core.errors import NatsUnavailableError

log = structlog.get_logger(__name__)

Connection: TypeAlias = Client
"""A connection to the town's NATS (nats-py's client): opened by ``connect``, closed by ``close_quietly``."""

CLIENT_ERROR_QUIET_S = 30.0
"""After a client error is logged, the same connection logs the next one no sooner than this, with how many
were left out: nats-py reports every failed reconnect (four a second while a server is gone)."""


class RepeatedErrors:
    """Which of a connection's errors reach the log: of each kind, the first of an outage, then one per
    ``quiet_s`` saying how many were left out; a reconnect ends the outage. Pure: the caller passes the time."""

    def __init__(self, quiet_s: float = CLIENT_ERROR_QUIET_S) -> None:
        self.quiet_s = quiet_s
        self._kinds: dict[str, tuple[float, int]] = {}
        """Per kind of error: until when it is left out, and how many were."""

    def admit(self, kind: str, now: float) -> int | None:
        """None: leave this error out; else log it, with the returned count of its kind left out before it."""
        quiet_until, left_out = self._kinds.get(kind, (now, 0))
        if now < quiet_until:
            self._kinds[kind] = (quiet_until, left_out + 1)
            return None
        self._kinds[kind] = (now + self.quiet_s, 0)
        return left_out

    def reset(self) -> int:
        """The outage ended: the next error of any kind is logged at once. How many were left out since the last
        ones logged."""
        left_out = sum(count for _, count in self._kinds.values())
        self._kinds.clear()
        return left_out


@map_errors
async def connect(config: TownConfig, *, name: str, connect_attempts: int = 1) -> Connection:
    """Connect, trying ``connect_attempts`` times (-1: until it works); once connected the client
    reconnects forever.

    Raises:
        NatsUnavailableError: every attempt failed.
    """

    websockets_for(config.servers)
    connected = False
    watch = PermissionWatch(describe_user(config))
    refused: list[Exception] = []
    repeats = RepeatedErrors()

    async def on_error(exc: Exception) -> None:
        if clients and clients[-1] in _RESTING:
            return  # kept between two calls, it meets its end unseen; the next call makes a fresh one
        denied = watch.record(exc)
        if denied is not None:
            # The server dropped what was sent; the caller only sees a timeout unless it asked ``guarded``.
            log.error("nats_permission_denied", subject=denied.subject, user=denied.user, operation=denied.operation)
            return
        # Failures of the first connect are reported once, below, not once per try.
        if connected:
            left_out = repeats.admit(type(exc).__name__, time.monotonic())
            if left_out is not None:
                extra = {"left_out": left_out} if left_out else {}
                log.warning("nats_client_error", connection=name, error=repr(exc), **extra)
        elif _refused_credentials(exc):
            refused.append(exc)  # nats-py then reports only that no server was left to try

    async def on_disconnect() -> None:
        if clients and (clients[-1].is_closed or clients[-1] in _RESTING):
            log.debug("nats_closed")  # closed by this process (nats-py reports that as a disconnect too): no news
        else:
            log.warning("nats_disconnected")

    async def on_reconnect() -> None:
        left_out = repeats.reset()
        log.info("nats_reconnected", **({"errors_left_out": left_out} if left_out else {}))

    options: dict[str, Any] = {
        "servers": config.servers,
        "name": name,
        "allow_reconnect": True,
        # nats-py also applies this to the first connect, where -1 would retry forever and never report
        # that no server answers; it becomes -1 once connected (below).
        "max_reconnect_attempts": 1,
        "reconnect_time_wait": 0.25,
        "connect_timeout": 2,
        "error_cb": on_error,
        "disconnected_cb": on_disconnect,
        "reconnected_cb": on_reconnect,
        "pending_size": 64 * 1024 * 1024,
    }
    if config.inbox_prefix:
        # Requests, JetStream pull and ordered consumers and KV watches all take their inboxes from it.
        options["inbox_prefix"] = config.inbox_prefix
    if config.nats_creds:
        options["user_credentials"] = config.nats_creds
    elif config.nats_user:
        options["user"] = config.nats_user
        options["password"] = config.nats_password or ""
    last_error: Exception | None = None
    attempt = 0
    clients: list[Client] = []  # the one being connected, for the disconnect callback
    while connect_attempts < 0 or attempt < max(1, connect_attempts):
        nc = Client()
        clients[:] = [nc]
        try:
            await nc.connect(**options)
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            # A refused login leaves the attempt's socket open in nats-py: close it, or a process that retries
            # (a session's `gt` waiting out a witness restart) collects one per try.
            await _discard(nc)
            last_error = exc
            attempt += 1
            if connect_attempts >= 0 and attempt >= connect_attempts:
                break
            if attempt in (1, 10) or attempt % 100 == 0:
                log.warning("nats_connect_retry", url=config.nats_url, attempt=attempt, error=repr(exc))
            await pause(min(2.0, 0.1 * 2 ** min(attempt, 5)))
            continue
        connected = True
        nc.options["max_reconnect_attempts"] = -1  # once connected, reconnect forever
        register(nc, watch)
        return nc
    failure = refused[-1] if refused else last_error
    raise NatsUnavailableError(
        config.nats_url, _describe(failure, watch.user), refused=failure is not None and _refused_credentials(failure)
    )


@map_errors
async def connect_as_session_or_user(
    config: TownConfig,
    *,
    name: str,
    patience_s: float,
    connect_attempts: int,
    on_wait: Callable[[str], None] | None = None,
) -> Connection:
    """``connect``; a connection that fails (no server answers, or the login is refused or not answered) is tried
    again, once a second, for ``patience_s`` (a polecat session's ``gt``: gt/cli/patience.py), each failure told to
    ``on_wait``: an agent's call outlasts a town restart (``gt down``, ``gt up``), a NATS node's restart, or a
    witness restart (a session's credential is checked by the witness's auth callout responder, and while the
    witness restarts there is none; the server then refuses the login after its own wait for an answer, 2 s,
    which on a loaded machine can come after the client's connect timeout: a login that got no answer is retried
    like a refused one).

    Raises:
        NatsUnavailableError: every attempt failed (once the patience is spent).
    """
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return await connect(config, name=name, connect_attempts=connect_attempts)
        except NatsUnavailableError as exc:
            if time.monotonic() >= deadline:
                raise
            log.info("connect_retrying", user=describe_user(config), refused=exc.refused)
            if on_wait is not None:
                on_wait(str(exc))
            await pause(min(1.0, max(0.0, deadline - time.monotonic())))


async def _discard(nc: Connection) -> None:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(2):
            await nc.close()


def describe_user(config: TownConfig) -> str:
    """Who a connection logs in as, for messages (never the password)."""
    if config.nats_creds:
        return f"in {config.nats_creds}"
    return config.nats_user or "(anonymous)"


def _refused_credentials(exc: Exception) -> bool:
    return isinstance(exc, nats.errors.AuthorizationError) or "authorization violation" in str(exc).lower()


def _describe(exc: Exception | None, user: str) -> str:
    if isinstance(exc, nats.errors.NoServersError):
        return "no server answered"
    if exc is not None and _refused_credentials(exc):
        return f"the server refused the credentials of user {user} (NATS_USER, NATS_PASSWORD, NATS_CREDS)"
    return repr(exc)


@map_errors
async def connect_unless_stopped(config: TownConfig, name: str, stop: asyncio.Event) -> Connection | None:
    """Connect (retrying forever), unless ``stop`` is set first: then None, with the attempt cancelled."""
    connecting = asyncio.ensure_future(connect(config, name=name, connect_attempts=-1))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not connecting.done():
        connecting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await connecting
        return None
    return connecting.result()


_RESTING: weakref.WeakSet[Client] = weakref.WeakSet()
"""Connections kept between two calls (``shared.bus.kept``): what becomes of them meanwhile is nobody's news."""


def set_resting(nc: Connection, resting: bool) -> None:
    """Mark ``nc`` kept between two calls (its disconnection and errors are not logged), or in use again."""
    if resting:
        _RESTING.add(nc)
    else:
        _RESTING.discard(nc)


def connection_key(config: TownConfig) -> tuple[Hashable, ...]:
    """What a connection ``connect(config)`` makes is: the servers, the login (the credentials file's content,
    which a session's witness may rewrite), the inbox prefix. Two configurations with the same key may share
    a connection."""
    creds: bytes | None = None
    if config.nats_creds:
        try:
            creds = Path(config.nats_creds).read_bytes()
        except OSError:
            creds = b"unreadable"  # its connect fails and says why; nothing kept is used in its place
    return (
        tuple(config.servers),
        config.nats_user,
        config.nats_password,
        config.nats_creds,
        creds,
        config.inbox_prefix,
    )


def socket_of(nc: Connection) -> int | None:
    """The descriptor of ``nc``'s socket; None when it has none (closed) or it cannot be told."""
    writer = getattr(getattr(nc, "_transport", None), "_io_writer", None)
    sock = writer.get_extra_info("socket") if writer is not None else None
    try:
        fd = int(sock.fileno()) if sock is not None else -1
    except OSError:
        return None
    return fd if fd >= 0 else None  # -1: closed


def peer_closed(fd: int) -> bool:
    """Whether the server closed (or reset) the connection on socket ``fd``, read without running the event loop
    or taking anything from the socket: ``POLLRDHUP``/``POLLHUP``/``POLLERR`` (what arrived for the client, a
    server's PING, is left for it)."""
    poller = select.poll()
    poller.register(fd, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(0))


@map_errors
async def close_at_once(nc: Connection, *, within_s: float = 5.0) -> None:
    """Close without draining, within ``within_s``: for a process that has every answer it waited for (a ``gt``
    call). What it published and has not sent yet is still written before the socket closes (nats-py's ``close``); only
    the drain's round trip, which waits for deliveries nobody is waiting for any more, is saved (0.5 ms of a
    3 ms call)."""
    with contextlib.suppress(nats.errors.Error, TimeoutError):
        async with asyncio.timeout(within_s):
            await nc.close()


@map_errors
async def close_quietly(nc: Connection) -> None:
    """Drain (flushing buffered publishes and acknowledgements, within 5 s), then close (within 5 s); errors of a
    connection already gone are expected on the way out and not raised."""
    with contextlib.suppress(nats.errors.Error, TimeoutError):
        async with asyncio.timeout(5):
            await nc.drain()
    with contextlib.suppress(nats.errors.Error, TimeoutError):
        # Bounded too: nats-py's close waits for the socket to flush and close, which can block for good when
        # a drain was cut short; a process on its way out must not hang there.
        async with asyncio.timeout(5):
            await nc.close()
