"""A minimal HTTP/1.1 server for one read-only page (``GET /metrics``), on asyncio streams only.

Every request gets one response and the connection is closed: scrapers handle that, and it keeps the
server free of keep-alive state. Anything but ``GET <path>`` is 404; a malformed request is 400.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger(__name__)

MAX_HEADER_BYTES = 16 * 1024
READ_TIMEOUT_S = 10.0

Render = Callable[[], Awaitable[str]]


def parse_request_line(line: bytes) -> tuple[str, str] | None:
    """``GET /metrics?x=1 HTTP/1.1`` -> ("GET", "/metrics"); None when it is not a request line."""
    parts = line.decode("latin-1").strip().split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
        return None
    return parts[0], parts[1].split("?", 1)[0]


def response(status: int, reason: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class PageServer:
    """Serves ``render()`` on ``GET path``."""

    def __init__(self, render: Render, *, host: str, port: int, path: str, content_type: str) -> None:
        self._render = render
        self._host = host
        self._port = port
        self._path = path
        self._content_type = content_type
        self._server: asyncio.Server | None = None
        self.port: int | None = None
        """The bound port (the one asked for, or the one the OS chose for 0)."""

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self._host, self._port, limit=MAX_HEADER_BYTES)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def serve_forever(self) -> None:
        assert self._server is not None
        try:
            await self._server.serve_forever()
        finally:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await self._read_request(reader)
            if request is None:
                reply = response(400, "Bad Request", b"malformed request\n")
            elif request == ("GET", self._path):
                reply = await self._page()
            else:
                reply = response(404, "Not Found", f"only GET {self._path} is served here\n".encode())
            writer.write(reply)
            await writer.drain()
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # the client went away, was too slow or sent too much: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _read_request(self, reader: asyncio.StreamReader) -> tuple[str, str] | None:
        async with asyncio.timeout(READ_TIMEOUT_S):
            request = parse_request_line(await reader.readline())
            while (await reader.readline()).strip():
                pass  # headers: nothing in them changes the answer
        return request

    async def _page(self) -> bytes:
        try:
            body = await self._render()
        except Exception as exc:
            log.exception("page_render_failed", path=self._path)
            return response(500, "Internal Server Error", f"rendering failed: {exc!r}\n".encode())
        return response(200, "OK", body.encode(), self._content_type)
