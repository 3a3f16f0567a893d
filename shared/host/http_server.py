"""Serving an aiohttp application on a TCP port: the project's three HTTP servers (the dashboard, the scripted
model server, the metrics endpoint) start and stop theirs here.

aiohttp reports a request it could not parse (a TLS hello on the plain port, a bad request line) and a handler
that raised through the stdlib ``logging`` module, which the project does not configure (a traceback on stderr
for every scanner's probe). Here they become structlog events: a malformed request at debug (the client was
answered 400, as before: nothing for an operator to do), a handler's failure at error (a bug).
"""

from __future__ import annotations

import logging

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

log = structlog.get_logger(__name__)


class _ToStructlog(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        if error is None or isinstance(error, HttpProcessingError):
            log.debug("http_bad_request", message=record.getMessage(), error=repr(error))
        else:
            log.error("http_handler_failed", message=record.getMessage(), error=repr(error), exc_info=record.exc_info)


_server_log = logging.getLogger("gastown.http")
_server_log.propagate = False
_server_log.addHandler(_ToStructlog())
_server_log.setLevel(logging.DEBUG)


SERVER_LOG = _server_log
"""The logger to give aiohttp's request handlers (``logger=``): what it says becomes structlog events."""


def app_runner(app: web.Application, *, shutdown_timeout: float = 1.0) -> web.AppRunner:
    """A runner for ``app``: no access log, aiohttp's messages through structlog. ``shutdown_timeout``: how long
    ``cleanup()`` lets open requests (a stream a client still reads) finish before it cancels them."""
    return web.AppRunner(app, access_log=None, logger=SERVER_LOG, shutdown_timeout=shutdown_timeout)


async def start(runner: web.BaseRunner, host: str, port: int) -> int:
    """Set ``runner`` up listening on ``host:port`` (0: a free port); the bound port. ``await runner.cleanup()``
    stops it."""
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return int(runner.addresses[0][1])
