"""structlog configuration, called once from each ``__main__`` (never at import time)."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(service: str, *, json: bool | None = None, level: str = "INFO", cache_loggers: bool = True) -> None:
    """JSON lines when not on a TTY (or ``json=True``); coloured key-value lines on a TTY.

    ``cache_loggers``: each logger keeps the configuration it was first used with (faster). A process that is
    configured again with another level (a ``gt`` client helper's worker, call after call) passes False."""
    use_json = (not sys.stderr.isatty()) if json is None else json
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=True)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=cache_loggers,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service)


FORMING_GRACE_S = 30.0
"""How long a process waits for a NATS cluster that is still forming (JetStream not answering yet, no responders,
timeouts) before it calls that a problem: while a fresh stack's nodes find each other and elect their leaders,
a service's first requests fail for a few seconds, as expected. Logged at info within the grace, at warning past
it."""


def forming(since: float, now: float) -> bool:
    """Whether a wait that began at ``since`` (monotonic seconds) is still within ``FORMING_GRACE_S`` at ``now``."""
    return now - since < FORMING_GRACE_S
