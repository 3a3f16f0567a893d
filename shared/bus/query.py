"""Ask a service a question: a typed query (``shared/queries``) as request/reply on ``gt.q.<service>.<name>``,
answered from its projection (docs/architecture.md, "Sending a command and asking a query").

The reply is ``{"ok": true, "result": ...}`` or ``{"ok": false, "code": ..., "message": ...}``. ``ask`` reads the
result into the query's reply type; ``ask_json`` gives it as it came, for printing it as it came (``--json``).
``serve`` is the other side: a service's subscription to its queries, answered with ``answer``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar, cast

import msgspec
import nats.errors

from shared.bus.connection import Connection
from shared.errors import QueryError
from shared.queries import Query, reply_type

R = TypeVar("R")
_DECODE = msgspec.json.Decoder()
DEFAULT_TIMEOUT_S = 15.0


async def ask(nc: Connection, query: Query[R], *, timeout: float = DEFAULT_TIMEOUT_S) -> R:
    """Ask ``query`` and read the answer into its reply type.

    Raises:
        QueryError: the service answered with an error, is not running (``unavailable``), timed out, or answered
            with something its reply type cannot hold (``malformed``).
    """
    return reply_of(query, await ask_json(nc, query, timeout=timeout))


async def ask_json(nc: Connection, query: Query[Any], *, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    """Ask ``query``; its answer's ``result`` as it came (JSON types). Raises like ``ask``."""
    service = query.addressee()
    try:
        reply = await nc.request(query.subject(), query.body(), timeout=timeout)
    except nats.errors.NoRespondersError:
        raise QueryError("unavailable", f"the {service} is not running (nobody answers {service} queries)") from None
    except (TimeoutError, nats.errors.TimeoutError):
        raise QueryError("timeout", f"the {service} did not answer within {timeout}s") from None
    try:
        answer = _DECODE.decode(reply.data)
    except msgspec.DecodeError:
        answer = None
    if not isinstance(answer, dict):
        raise QueryError("malformed", f"the {service} answered {query.subject()} with something not a JSON object")
    if not answer.get("ok"):
        raise QueryError(answer.get("code", "error"), answer.get("message", "query failed"))
    return answer.get("result")


def reply_of(query: Query[R], result: Any) -> R:
    """``result`` (as ``ask_json`` gave it) read into ``query``'s reply type."""
    wanted = reply_type(type(query))
    if wanted is Any:
        return cast(R, result)
    try:
        return cast(R, msgspec.convert(result, wanted))
    except msgspec.ValidationError as exc:
        raise QueryError("malformed", f"the answer to {query.subject()} does not read as expected: {exc}") from None


class Request(NamedTuple):
    """A query as it came."""

    subject: str
    reply: str
    """Where the answer goes ("" when the asker wants none)."""
    data: bytes
    headers: dict[str, str] | None


class Serving:
    """A subscription to queries; ``close`` ends it."""

    def __init__(self, sub: Any) -> None:
        self._sub = sub

    async def close(self) -> None:
        with contextlib.suppress(nats.errors.Error):
            await self._sub.unsubscribe()


async def serve(nc: Connection, subject: str, *, queue: str, on_request: Callable[[Request], None]) -> Serving:
    """Hand every request on ``subject`` to ``on_request`` (called on the connection's reader: it must not block;
    it starts a task for anything slow). Instances in one ``queue`` share the requests: each goes to one."""

    async def on_msg(msg: Any) -> None:
        on_request(Request(msg.subject, msg.reply or "", msg.data, msg.headers))

    return Serving(await nc.subscribe(subject, queue=queue, cb=on_msg))


async def answer(nc: Connection, request: Request, body: bytes) -> None:
    """Send ``body`` to the request's reply subject (nothing when it has none); a lost answer is the asker's
    timeout, never raised here."""
    if request.reply:
        with contextlib.suppress(nats.errors.Error):
            await nc.publish(request.reply, body, headers=request.headers)
