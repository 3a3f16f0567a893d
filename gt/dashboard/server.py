"""``gt dashboard``: a web page that follows the log live, served over HTTP with server-sent events.

Routes (GET only; anything else is 404 or 405). A request whose ``Host`` is not an IP address, ``localhost`` or
the address the dashboard is bound to (with its port) is answered 421 and nothing else: a web page whose DNS name
was re-bound to this machine cannot read the town. Every route but ``/healthz`` also needs the dashboard's token
(``GT_HOME/secrets/dashboard.token``): ``/?token=<it>``, the address ``gt dashboard`` prints, serves the page and
sets it as a cookie (``HttpOnly``, ``SameSite=Strict``) that the page's own requests carry; a request with neither is
answered 401. Loopback is everyone's on the machine: an agent reached ``/api/state`` (mail subjects, handoff notes).

- ``/``: the page (``page.py``); it opens ``/events`` and redraws on every message.
- ``/events``: ``text/event-stream``. Each message is ``event: state`` with the whole view as JSON (convoys,
  polecats, merge queue, escalations, the latest events, the gate runners and merge figures), sent on connect and
  then at most every ``PUSH_INTERVAL_S`` while the log moves or the board changes; a comment every ``KEEPALIVE_S``
  keeps proxies from closing it.
  ``retry: 1000`` makes a browser reconnect within a second after the dashboard restarts.
- ``/api/state``: the same view, once.
- ``/api/bead/<id>``: the bead's timeline (its events and those of its sessions, merges and escalations).
- ``/healthz``: 200 once the dashboard has replayed the log.

The view is a fold of the log the dashboard replays itself on start (``view.py``), read with the services'
``EventReader``, which resubscribes after a NATS restart from the last sequence it applied; beside it, the
refinery's board (``gt.q.refinery.board``: the gate runners, the gate jobs running and waiting, merges per hour and
gate minutes per merge, as `gt mq runners` shows them), asked every ``BOARD_INTERVAL_S``: a runner's heartbeats
and a job's time move without the log moving. HTTP is aiohttp's (its low-level server; ``_route`` routes).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec
import structlog
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.web_protocol import RequestHandler

from gt.dashboard import view
from gt.dashboard.page import PAGE
from gt.narration import describe
from gt.story import bead_story
from shared.bus.errors import BusError
from shared.bus.query import ask
from shared.bus.reader import EventReader
from shared.core.config import TownConfig
from shared.core.errors import QueryError
from shared.host import http_server
from shared.model.queries import refinery

if TYPE_CHECKING:
    from shared.bus.connection import Connection

log = structlog.get_logger(__name__)

PUSH_INTERVAL_S = 0.25
KEEPALIVE_S = 15.0
CLIENT_QUEUE = 4
SHUTDOWN_S = 0.1
"""How long stopping waits for open requests: the event streams never end on their own."""
BOARD_INTERVAL_S = 1.0
BOARD_TIMEOUT_S = 2.0


class Dashboard:
    """Replays and follows the log into a ``DashboardState`` and serves it. ``run()`` blocks until
    ``shutdown()``; it re-raises what stopped it."""

    def __init__(
        self,
        nc: Connection,
        config: TownConfig,
        *,
        host: str = "127.0.0.1",
        port: int = 8765,
        allowed_hosts: tuple[str, ...] = (),
        token: str,
    ) -> None:
        """``allowed_hosts``: names besides IP addresses, ``localhost`` and ``host`` that browsers may reach it
        by (the machine's DNS name when bound to all interfaces, a reverse proxy's); ``token``: what every request
        but ``/healthz`` carries (``town_secrets.dashboard_token``)."""
        if not token:
            raise ValueError("the dashboard needs a token")
        self.nc = nc
        self.config = config
        self.host = host
        self.port = port
        self.token = token
        self.allowed_hosts = frozenset(name.lower() for name in allowed_hosts)
        self.state = view.DashboardState()
        self.replayed = asyncio.Event()
        self.listening = asyncio.Event()
        self._changed = asyncio.Event()
        self._clients: set[asyncio.Queue[bytes]] = set()
        self._stop = asyncio.Event()
        self._reader: EventReader | None = None
        self.replay_target: int | None = None
        """The log's last sequence when the dashboard started: replaying up to it comes before serving state."""
        self.board: refinery.MqBoard | None = None
        """The refinery's last answer to ``board`` (None until one came, or while it does not answer)."""
        self.board_error = ""
        """Why the board is not shown ("" when it is)."""

    # ---- the log --------------------------------------------------------------------------------

    def _apply(self, seq: int, subject: str, data: bytes) -> None:
        view.apply(self.state, seq, data)
        self._changed.set()

    async def _follow(self) -> None:
        self._reader = EventReader(self.nc, self.config.evt_stream, self._apply)
        reading = asyncio.create_task(self._reader.run(), name="dashboard-reader")
        try:
            last = await self._reader.stream_last_seq()
            self.replay_target = last
            log.info("dashboard_replaying", last_seq=last)
            await self._reader.wait_for_seq(last)
            self.replayed.set()
            log.info("dashboard_replayed", last_seq=self.state.last_seq)
            await reading
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading

    async def _watch_board(self) -> None:
        """Ask the refinery for its board every ``BOARD_INTERVAL_S``; a change is pushed like the log's."""
        await self.replayed.wait()
        while True:
            try:
                board, error = await ask(self.nc, refinery.Board(), timeout=BOARD_TIMEOUT_S), ""
            except (QueryError, BusError, TimeoutError) as exc:
                board, error = None, f"the refinery did not answer: {exc}"
            if board != self.board or error != self.board_error:
                self.board, self.board_error = board, error
                self._changed.set()
            await asyncio.sleep(BOARD_INTERVAL_S)

    async def _push(self) -> None:
        await self.replayed.wait()
        while True:
            await self._changed.wait()
            self._changed.clear()
            message = self._state_message()
            for queue in list(self._clients):
                if queue.full():
                    with contextlib.suppress(asyncio.QueueEmpty):
                        queue.get_nowait()  # a slow page gets the newest view, not a backlog of old ones
                queue.put_nowait(message)
            await asyncio.sleep(PUSH_INTERVAL_S)

    def _view(self) -> dict[str, object]:
        return view.render(self.state, self.board, self.board_error)

    def _state_message(self) -> bytes:
        body = msgspec.json.encode(self._view())
        return b"event: state\ndata: " + body + b"\n\n"

    # ---- HTTP -------------------------------------------------------------------------------------

    async def run(self) -> None:
        runner = web.ServerRunner(_Server(self._handle), shutdown_timeout=SHUTDOWN_S)
        self.port = await http_server.start(runner, self.host, self.port)
        self.listening.set()
        log.info("dashboard_listening", url=f"http://{self.host}:{self.port}/")
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._follow(), name="dashboard-follow")
                tasks.create_task(self._push(), name="dashboard-push")
                tasks.create_task(self._watch_board(), name="dashboard-board")
                stop = tasks.create_task(self._stop.wait(), name="dashboard-stop")
                await stop
                raise _Stopped
        finally:
            await runner.cleanup()

    async def shutdown(self) -> None:
        """Idempotent, and safe before ``run``."""
        self._stop.set()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if not self.host_allowed(request.headers.get("Host")):
            # DNS rebinding: a page of evil.example whose name now resolves to this machine sends its own name.
            return _answer(421, "text/plain", MISDIRECTED)
        return await self._route(request)

    def host_allowed(self, host: str | None) -> bool:
        """A ``Host`` header naming this dashboard: an IP address, ``localhost``, the address it was bound to or
        a name allowed with ``--allow-host`` (never a DNS name of someone else's), with its port if one is given
        (any port for an allowed name: a reverse proxy's)."""
        try:
            parsed = urllib.parse.urlsplit(f"//{host}")
            name, port = (parsed.hostname or ""), parsed.port
        except ValueError:
            return False
        if not host:
            return False
        if name in self.allowed_hosts:
            return True
        return port in (None, self.port) and (_is_ip(name) or name in ("localhost", self.host.lower()))

    async def _route(self, request: web.BaseRequest) -> web.StreamResponse:
        target = urllib.parse.urlsplit(request.raw_path).path
        if request.method != "GET":
            return _answer(405, "text/plain", b"only GET\n")
        if target == "/healthz":
            ok = self.replayed.is_set()
            return _answer(200 if ok else 503, "text/plain", b"ok\n" if ok else b"replaying\n")
        given = urllib.parse.parse_qs(urllib.parse.urlsplit(request.raw_path).query).get("token", [""])[0]
        if not (self._is_token(given) or self._is_token(request.cookies.get(TOKEN_COOKIE, ""))):
            return _answer(401, "text/plain", UNAUTHORIZED)
        if target == "/":
            page = _answer(200, "text/html; charset=utf-8", PAGE.encode())
            page.set_cookie(TOKEN_COOKIE, self.token, httponly=True, samesite="Strict", path="/")
            return page
        if target == "/api/state":
            return _answer(200, "application/json", msgspec.json.encode(self._view()))
        if target.startswith("/api/bead/"):
            return await self._bead(urllib.parse.unquote(target.removeprefix("/api/bead/")))
        if target == "/events":
            return await self._events(request)
        return _answer(404, "text/plain", b"not found\n")

    def _is_token(self, given: str) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self.token.encode())

    async def _bead(self, bead: str) -> web.Response:
        if not bead or "/" in bead:
            return _answer(400, "application/json", b'{"error": "a bead id, like /api/bead/gt-abc123"}')
        try:
            entries, missing = await bead_story(self.nc, self.config, bead)
        except (BusError, TimeoutError) as exc:
            body = json.dumps({"error": f"the log could not be read: {type(exc).__name__}"}).encode()
            return _answer(503, "application/json", body)
        if not entries:
            return _answer(404, "application/json", json.dumps({"error": f"no events for bead {bead}"}).encode())
        timeline = []
        for e in entries:
            text, kind = describe(e.type, e.data)
            timeline.append({"seq": e.seq, "ts": e.ts, "type": e.type, "actor": e.actor, "text": text, "kind": kind})
        return _answer(
            200, "application/json", msgspec.json.encode({"bead": bead, "events": timeline, "missing": missing})
        )

    async def _events(self, request: web.BaseRequest) -> web.StreamResponse:
        stream = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "Connection": "keep-alive",
                "X-Accel-Buffering": "no",
            }
        )
        await stream.prepare(request)
        await stream.write(b"retry: 1000\n\n")
        queue: asyncio.Queue[bytes] = asyncio.Queue(CLIENT_QUEUE)
        await self.replayed.wait()
        queue.put_nowait(self._state_message())
        self._clients.add(queue)
        try:
            while True:
                try:
                    message = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    message = b": keep-alive\n\n"
                await stream.write(message)  # raises once the page went away
        finally:
            self._clients.discard(queue)


MISDIRECTED = b"unknown host: open the dashboard at the address it prints\n"
UNAUTHORIZED = b"no token: open the dashboard at the address `gt dashboard` prints (it carries ?token=)\n"
TOKEN_COOKIE = "gt_dashboard"  # noqa: S105 (the cookie's name)


class _Handler(RequestHandler):
    """aiohttp's connection handler, but a request without ``Host`` (which its parser refuses with 400 before any
    handler runs) is answered 421 like any other request for a name that is not the dashboard's."""

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if isinstance(exc, BadHttpMessage) and "Host" in str(exc.message):
            return _answer(421, "text/plain", MISDIRECTED)
        return super().handle_error(request, status, exc, message)


class _Server(web.Server):
    def __init__(self, handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]) -> None:
        super().__init__(handler, access_log=None, logger=http_server.SERVER_LOG)

    def __call__(self) -> RequestHandler:
        return _Handler(self, loop=self._loop, **self._kwargs)  # as web.Server's own, with the handler above


class _Stopped(Exception):
    """Ends the task group on ``shutdown``."""


async def serve(dashboard: Dashboard) -> None:
    """Run until ``shutdown``; a stop asked for is not an error."""
    try:
        await dashboard.run()
    except* _Stopped:
        pass


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _answer(status: int, content_type: str, body: bytes) -> web.Response:
    """One whole answer; the connection is closed after it (as every answer but the event stream's)."""
    answer = web.Response(status=status, body=body, headers={"Content-Type": content_type, "Cache-Control": "no-cache"})
    answer.force_close()
    return answer
