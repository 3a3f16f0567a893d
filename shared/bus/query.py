"""Ask a service a question: a typed query (``shared/model/queries``) as request/reply on ``gt.q.<service>.<name>``,
answered from its projection (docs/architecture.md, "Sending a command and asking a query").

The reply is ``{"ok": true, "result": ...}`` or ``{"ok": false, "code": ..., "message": ...}``. ``ask`` reads the
result into the query's reply type; ``ask_json`` gives it as it came, for printing it as it came (``--json``).
``serve`` is the other side: a service's subscription to its queries, answered with ``answer``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar, cast

import msgspec
import nats.errors

from shared.bus.connection import Connection
from shared.bus.errors import map_errors
from shared.core.aio import pause
from shared.core.errors import QueryError
from shared.model.queries import Query, reply_type
from shared.model.queries.base import DEFAULT_LIST_LIMIT

R = TypeVar("R")
_DECODE = msgspec.json.Decoder()
DEFAULT_TIMEOUT_S = 15.0


UNAVAILABLE_RETRY_S = 0.5
"""How often a patient asker (``patience_s``) asks again a service that nobody answers for."""


@map_errors
async def ask(nc: Connection, query: Query[R], *, timeout: float = DEFAULT_TIMEOUT_S) -> R:
    """Ask ``query`` and read the answer into its reply type.

    Raises:
        QueryError: the service answered with an error, is not running (``unavailable``), timed out, or answered
            with something its reply type cannot hold (``malformed``).
    """
    return reply_of(query, await ask_json(nc, query, timeout=timeout))


OnWait = Callable[[str], None]
"""Told why a patient asker asks again (the service is not running)."""


@map_errors
async def ask_json(
    nc: Connection,
    query: Query[Any],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    patience_s: float = 0.0,
    on_wait: OnWait | None = None,
) -> Any:
    """Ask ``query``; its answer's ``result`` as it came (JSON types). Raises like ``ask``; while the service is
    not running (nobody answers its queries: a restart) it is asked again for up to ``patience_s`` seconds, each
    time told to ``on_wait``."""
    return (await _ask(nc, query, timeout, patience_s, on_wait))["result"]


class Listing(NamedTuple):
    """What ``ask_all`` gathered: the items, and whether more were listed than the query's ``limit`` let in."""

    items: list[Any]
    more: bool


@map_errors
async def ask_all(
    nc: Connection,
    query: Query[Any],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    patience_s: float = 0.0,
    on_wait: OnWait | None = None,
) -> Listing:
    """Ask a list query (one with ``limit`` and ``after``) page after page, following each answer's ``next``,
    until it has ``limit`` items (None: ``DEFAULT_LIST_LIMIT``; 0: every one) or the list ends. A page the service
    cut to fit one reply is followed like any other, so no list is too long to read. Raises like ``ask``;
    ``patience_s`` and ``on_wait`` as for ``ask_json``, for each page."""
    limit = getattr(query, "limit", None)
    wanted = DEFAULT_LIST_LIMIT if limit is None else limit
    items: list[Any] = []
    while True:
        answer = await _ask(nc, query, timeout, patience_s, on_wait)
        page = answer["result"]
        if not isinstance(page, list):
            raise QueryError("malformed", f"the answer to {query.subject()} is not a list")
        items.extend(page)
        cursor = answer.get("next")
        if not isinstance(cursor, str) or not page:
            return Listing(items, more=False)
        if wanted and len(items) >= wanted:
            return Listing(items[:wanted], more=True)
        remaining = wanted - len(items) if wanted else 0
        query = msgspec.structs.replace(query, after=cursor, limit=remaining)


async def _ask(
    nc: Connection, query: Query[Any], timeout: float, patience_s: float = 0.0, on_wait: OnWait | None = None
) -> dict[str, Any]:
    """The answer to ``query``, checked to be a success."""
    service = query.addressee()
    give_up_at = time.monotonic() + patience_s
    while True:
        try:
            reply = await nc.request(query.subject(), query.body(), timeout=timeout)
        except nats.errors.NoRespondersError:
            down = f"the {service} is not running (nobody answers {service} queries)"
            if time.monotonic() >= give_up_at:
                raise QueryError("unavailable", down) from None
            if on_wait is not None:
                on_wait(down)
            await pause(UNAVAILABLE_RETRY_S)
            continue
        except (TimeoutError, nats.errors.TimeoutError):
            raise QueryError("timeout", f"the {service} did not answer within {timeout}s") from None
        break
    try:
        answer = _DECODE.decode(reply.data)
    except msgspec.DecodeError:
        answer = None
    if not isinstance(answer, dict):
        raise QueryError("malformed", f"the {service} answered {query.subject()} with something not a JSON object")
    if not answer.get("ok"):
        raise QueryError(answer.get("code", "error"), answer.get("message", "query failed"))
    answer.setdefault("result", None)
    return answer


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

    @map_errors
    async def close(self) -> None:
        with contextlib.suppress(nats.errors.Error):
            await self._sub.unsubscribe()


@map_errors
async def serve(nc: Connection, subject: str, *, queue: str, on_request: Callable[[Request], None]) -> Serving:
    """Hand every request on ``subject`` to ``on_request`` (called on the connection's reader: it must not block;
    it starts a task for anything slow). Instances in one ``queue`` share the requests: each goes to one."""

    async def on_msg(msg: Any) -> None:
        on_request(Request(msg.subject, msg.reply or "", msg.data, msg.headers))

    return Serving(await nc.subscribe(subject, queue=queue, cb=on_msg))


@map_errors
async def answer(nc: Connection, request: Request, body: bytes) -> bool:
    """Send ``body`` to the request's reply subject (nothing when it has none). False when it could not be sent
    (the connection is closing, the body is over the server's limit): the caller logs it; never raised here."""
    if not request.reply:
        return True
    try:
        await nc.publish(request.reply, body, headers=request.headers)
    except nats.errors.Error:
        return False
    return True


def max_payload(nc: Connection) -> int:
    """The largest message the connected server carries (its INFO's ``max_payload``)."""
    return int(nc.max_payload)
