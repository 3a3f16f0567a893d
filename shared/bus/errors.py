"""The bus's error boundary: the NATS client's errors become the project's, here and only here.

Every port of the bus (each public coroutine, async generator and context manager of ``shared/bus``) is wrapped in
``map_errors``: what leaves it is a ``BusError`` (``shared.core.errors``) or one of its typed subclasses, never a
class of nats-py, so code outside the bus catches the project's errors only (tests/unit/test_bus_owns_nats.py).
What a port expects (a key or a message that is not there, a compare-and-set that lost) it still answers as a
value instead (None, False), catching the client's own error inside. Whether a failure is worth retrying is
data on the error (``GastownError.retryable``), read by ``retryable()``, for the client's errors too, so the bus's
own retry loops need no list of classes.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, ParamSpec, TypeVar, overload

import nats.errors
import nats.js.errors

from shared.core.errors import (
    BusError,
    BusTimeoutError,
    ConnectionLostError,
    JetStreamApiError,
    JetStreamUnavailableError,
    NatsNotAnsweringError,
    NoStreamError,
    NotProvisionedError,
)
from shared.core.errors import retryable as _retryable

__all__ = ["BusError", "map_errors", "mapped", "retryable", "translate"]

P = ParamSpec("P")
T = TypeVar("T")

_CONNECTION_LOST = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
)
"""The client's words for a connection that is gone or going: what was under way may or may not have arrived."""


def translate(exc: BaseException) -> BaseException:
    """The project's error for one of the NATS client's (``exc`` itself for any other)."""
    if not isinstance(exc, nats.errors.Error):
        return exc
    kind = type(exc).__name__
    if isinstance(exc, nats.errors.TimeoutError):  # the flush, drain and fetch timeouts too
        return BusTimeoutError(kind)
    if isinstance(exc, nats.errors.NoRespondersError):
        return NatsNotAnsweringError(kind)
    if isinstance(exc, _CONNECTION_LOST):
        return ConnectionLostError(str(exc) or kind, kind=kind)
    if isinstance(exc, nats.js.errors.NoStreamResponseError):
        return NoStreamError()
    if isinstance(exc, nats.js.errors.ServiceUnavailableError):
        return JetStreamUnavailableError(kind)
    if isinstance(exc, nats.js.errors.NotFoundError):
        return NotProvisionedError(f"{exc.description}", code=exc.code, err_code=exc.err_code)
    if isinstance(exc, nats.js.errors.APIError):
        return JetStreamApiError(f"{exc.description}", code=exc.code, err_code=exc.err_code, kind=kind)
    return BusError(str(exc) or kind, kind=kind)


def retryable(exc: BaseException) -> bool:
    """Whether ``exc`` (the project's or the NATS client's) is worth trying again: ``GastownError.retryable``."""
    return _retryable(translate(exc))


@contextlib.contextmanager
def mapped() -> Iterator[None]:
    """Raise the project's error in place of the NATS client's (the original is its ``__cause__``)."""
    try:
        yield
    except nats.errors.Error as exc:
        raise translate(exc) from exc


@overload
def map_errors(port: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]: ...
@overload
def map_errors(port: Callable[P, AsyncGenerator[T]]) -> Callable[P, AsyncGenerator[T]]: ...
@overload
def map_errors(port: Callable[P, AsyncIterator[T]]) -> Callable[P, AsyncIterator[T]]: ...
def map_errors(port: Callable[P, Any]) -> Callable[P, Any]:
    """Wrap one of the bus's ports (a coroutine function or an async generator function) in ``mapped``.

    A port that calls another port of the bus sees that one's errors already translated (so the bus's own catches
    name the project's classes when they catch around a port)."""
    if inspect.isasyncgenfunction(port):

        @functools.wraps(port)
        async def each(*args: P.args, **kwargs: P.kwargs) -> AsyncGenerator[Any]:
            with mapped():
                async with contextlib.aclosing(port(*args, **kwargs)) as items:
                    async for item in items:
                        yield item

        return each
    if not inspect.iscoroutinefunction(port):
        raise TypeError(f"map_errors wraps coroutine and async generator functions, not {port!r}")

    @functools.wraps(port)
    async def call(*args: P.args, **kwargs: P.kwargs) -> Any:
        try:
            return await port(*args, **kwargs)
        except nats.errors.Error as exc:
            raise translate(exc) from exc

    return call
