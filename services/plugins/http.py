"""One read-only page (``GET /metrics``) over HTTP, served by aiohttp.

Every request gets one response and the connection is closed: scrapers handle that, and it keeps the
server free of keep-alive state. Anything but ``GET <path>`` is 404 (any query string is ignored); a
malformed request is aiohttp's 400.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from shared.host import http_server

log = structlog.get_logger(__name__)

Render = Callable[[], Awaitable[str]]


class PageServer:
    """Serves ``render()`` on ``GET path``."""

    def __init__(self, render: Render, *, host: str, port: int, path: str, content_type: str) -> None:
        self._render = render
        self._host = host
        self._port = port
        self._path = path
        self._content_type = content_type
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        """The bound port (the one asked for, or the one the OS chose for 0)."""

    async def start(self) -> int:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)  # one handler: any other method or path is 404
        self._runner = http_server.app_runner(app)
        self.port = await http_server.start(self._runner, self._host, self._port)
        return self.port

    async def serve_forever(self) -> None:
        assert self._runner is not None
        try:
            await asyncio.Event().wait()
        finally:
            await self._runner.cleanup()

    async def _answer(self, request: web.Request) -> web.Response:
        if request.method != "GET" or request.path != self._path:
            reply = _text(404, f"only GET {self._path} is served here\n")
        else:
            reply = await self._page()
        reply.force_close()  # "Connection: close": one request per connection
        return reply

    async def _page(self) -> web.Response:
        try:
            body = await self._render()
        except Exception as exc:
            log.exception("page_render_failed", path=self._path)
            return _text(500, f"rendering failed: {exc!r}\n")
        return web.Response(status=200, body=body.encode(), headers={"Content-Type": self._content_type})


def _text(status: int, text: str) -> web.Response:
    return web.Response(status=status, body=text.encode(), headers={"Content-Type": "text/plain; charset=utf-8"})
