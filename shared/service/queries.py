"""The query server: a service's answers to ``gt.q.<service>.*`` (docs/architecture.md, "Sending a command and
asking a query"), from its projection, by every instance that follows the log (a standby too).

The body is decoded into the query's own class (``shared.model.queries.registry``: the class the client built), which
the service answers with ``match``. Every query but ``status`` waits until the instance has applied the asker's
``min_seq`` (read-your-writes; the log's last sequence when the query arrives for ``LATEST_SEQ``, what a polecat
session asks, which may not read the log's state); ``digest`` is the projection's hash, for checking a live
projection against a fresh replay. A query from a polecat session (its own identity, named by the server in
``Nats-Request-Info``, or its private inbox) is first checked against what that session may ask.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any, Protocol

import msgspec
import structlog

from shared.bus import query as bus_query
from shared.bus.connection import Connection
from shared.core import subjects
from shared.core.decoding import UNDECODABLE
from shared.core.errors import QueryError
from shared.model.queries import registry
from shared.model.queries.base import LATEST_SEQ, PAGE_BYTES, Digest, DigestReply, Page, Query, ServiceStatus
from shared.service import query_limits
from shared.service.follower import Follower
from shared.service.projection import Projection
from shared.service.query_limits import QueryLimiter

log = structlog.get_logger(__name__)

MAX_MIN_SEQ_WAIT_S = 10.0
REPLY_HEADROOM_BYTES = 4096
"""Room left in a reply for its headers (the asker's, echoed) and the protocol line."""
MIN_REPLY_BYTES = 64 * 1024
ENVELOPE_BYTES = 1024
"""Of a reply, what a list page leaves for the rest of the answer (``ok``, ``seq``, ``next``)."""
_DECODER = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()


class Answering(Protocol):
    """What the server answers from: the service (``shared.service.Service``)."""

    @property
    def name(self) -> str: ...

    @property
    def query_scope(self) -> str: ...

    projection: Projection[Any]
    following: asyncio.Event
    reader: Follower | None

    def status(self) -> ServiceStatus: ...

    def query(self, query: Query[Any]) -> Any: ...

    def query_for_session(self, query: Query[Any], session: str) -> Any: ...

    def check_session_query(self, query: Query[Any], session: str) -> None: ...


class QueryServer:
    """Subscribed (in the service's queue group) from ``start`` until ``stop``; each query answered in a task."""

    def __init__(self, service: Answering) -> None:
        self._service = service
        self._nc: Connection | None = None
        self._serving: bus_query.Serving | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._limiter = QueryLimiter(query_limits.load())
        self.refused = 0
        """Queries not answered: their reply subject was no inbox (``subjects.is_inbox``)."""

    async def start(self, nc: Connection) -> None:
        scope = self._service.query_scope
        self._nc = nc
        self._serving = await bus_query.serve(
            nc, subjects.query_subject(scope, ">"), queue=f"{scope}-q", on_request=self._on_query
        )

    async def stop(self) -> None:
        if self._serving is not None:
            await self._serving.close()
        for task in list(self._tasks):
            task.cancel()

    def _on_query(self, request: bus_query.Request) -> None:
        if not subjects.is_inbox(request.reply):
            # The answer would be published with this service's rights (the log, KV, commands) on a subject the
            # asker chose: a forged event, an overwritten key. Only an inbox gets an answer.
            self.refused += 1
            if self.refused % 1000 == 1:
                log.warning(
                    "query_reply_refused", reply=request.reply[:120], subject=request.subject, refused=self.refused
                )
            return
        info = _request_info(request.headers)
        session = subjects.session_of_request(request.reply, info)
        agent = subjects.agent_of_request(request.reply, info)
        refusal = None
        if agent is not None:
            # An agent (a session, the mayor agent) asks within its limit: past it a refusal, far past it nothing.
            verdict = self._limiter.check(agent, time.monotonic())
            if verdict.drop:
                if self._limiter.dropped % 10_000 == 1:
                    log.warning("query_flood_dropped", session=agent, dropped=self._limiter.dropped)
                return
            if not verdict.answer:
                refusal = QueryError("rate_limited", verdict.message)
        task = asyncio.create_task(self._answer(request, session, refusal))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, request: bus_query.Request, session: str | None, refusal: QueryError | None) -> None:
        what = request.subject.rsplit(".", 1)[-1]
        assert self._nc is not None
        limit = max(MIN_REPLY_BYTES, bus_query.max_payload(self._nc) - REPLY_HEADROOM_BYTES)
        try:
            if refusal is None:
                reply = await self.answer(what, request.data, session, reply_bytes=limit - ENVELOPE_BYTES)
            else:
                reply = _error(refusal)
        except QueryError as exc:
            reply = _error(exc)
        except Exception as exc:
            log.exception("query_failed", query=what)
            reply = {"ok": False, "code": "error", "message": f"{self._service.name} failed to answer: {exc!r}"}
        body = fit_reply(reply, limit, what)
        if not await bus_query.answer(self._nc, request, body):
            log.warning("query_answer_failed", query=what, bytes=len(body))

    async def answer(
        self, what: str, data: bytes, session: str | None = None, reply_bytes: int | None = None
    ) -> dict[str, Any]:
        """The reply to query ``what`` with body ``data`` (asked from polecat session ``session``'s inbox)."""
        service = self._service
        projection = service.projection
        try:
            body: Any = _DECODER.decode(data) if data.strip() else {}
        except UNDECODABLE as exc:
            raise QueryError("malformed", f"query body is not JSON: {exc!r:.300}") from None
        if not isinstance(body, dict):
            raise QueryError("malformed", "a query body must be a JSON object")
        if what == "status":  # answered at once, whatever the body holds
            return {"ok": True, "seq": projection.last_seq, "result": service.status()}
        query = registry.decode(service.name, what, body)
        if session is not None:
            if isinstance(query, Digest):
                # A hash of the whole state, for the town's own checks (`python -m tests.chaos.town`): the costliest
                # answer there is, and nothing an agent needs.
                raise QueryError("unauthorized", f"a polecat session may not ask for the {service.name}'s digest")
            service.check_session_query(query, session)
        min_seq = query.min_seq or 0
        try:
            async with asyncio.timeout(MAX_MIN_SEQ_WAIT_S):
                await service.following.wait()
            assert service.reader is not None
            if min_seq == LATEST_SEQ:
                async with asyncio.timeout(MAX_MIN_SEQ_WAIT_S):
                    min_seq = await service.reader.stream_last_seq()
            await service.reader.wait_for_seq(min_seq, timeout=MAX_MIN_SEQ_WAIT_S)
        except TimeoutError:
            raise QueryError(
                "lagging", f"{service.name} has applied up to {projection.last_seq}, not yet {min_seq}; try again"
            ) from None
        if isinstance(query, Digest):
            # For checks that the live projection equals a fresh replay of the log up to ``last_seq``.
            digest = hashlib.sha256(projection.serialize_state()).hexdigest()
            result = DigestReply(last_seq=projection.last_seq, sha256=digest)
            return {"ok": True, "seq": projection.last_seq, "result": result}
        if reply_bytes is not None and query.PAGED:
            # A list answers a page of what fits in one reply (``Page``): fewer views built, none cut afterwards.
            asked = getattr(query, PAGE_BYTES)
            budget = asked if asked is not None and asked < reply_bytes else reply_bytes
            query = msgspec.structs.replace(query, **{PAGE_BYTES: budget})
        result = service.query(query) if session is None else service.query_for_session(query, session)
        if isinstance(result, Page):
            return {"ok": True, "seq": projection.last_seq, "result": result.items, "next": result.next}
        return {"ok": True, "seq": projection.last_seq, "result": result}


def _request_info(headers: dict[str, str] | None) -> dict[str, object] | None:
    """Who asked, as the NATS server says (``Nats-Request-Info``, set on a request from another account); None
    when the header is absent or unreadable."""
    raw = (headers or {}).get(subjects.REQUEST_INFO)
    if not raw:
        return None
    try:
        info = _DECODER.decode(raw)
    except UNDECODABLE:
        return None
    return info if isinstance(info, dict) else None


def _error(exc: QueryError) -> dict[str, Any]:
    return {"ok": False, "code": exc.code, "message": exc.message}


def fit_reply(reply: dict[str, Any], limit: int, what: str) -> bytes:
    """``reply`` encoded in at most ``limit`` bytes: a page (it has ``next``) that is too large is cut after the
    last item that fits, its ``next`` the cursor there, so the asker pages on; any other answer that is too large
    becomes a ``too_large`` error naming the limit. Never an answer the NATS server would refuse to carry, which the
    asker would only see as silence."""
    body = _ENCODER.encode(reply)
    if len(body) <= limit:
        return body
    items = reply.get("result")
    if "next" in reply and isinstance(items, list):
        frame = len(_ENCODER.encode({**reply, "result": [], "next": "x" * 200}))  # the rest of the answer, a cursor
        room, kept = limit - frame, 0
        for item in items:
            room -= len(_ENCODER.encode(item)) + 1
            if room < 0:
                break
            kept += 1
        if kept:
            cut = {**reply, "result": items[:kept], "next": str(items[kept - 1]["id"])[:200]}
            return _ENCODER.encode(cut)
    message = (
        f"the answer to {what} is {len(body)} bytes, over the {limit}-byte limit of one reply (the NATS server's "
        "max_payload, less room for headers); ask for less: a list query takes `limit` and pages with `after` "
        "(the CLI pages by itself)"
    )
    return _ENCODER.encode(_error(QueryError("too_large", message)))
