"""Crash points: a service kills itself (SIGKILL, like ``kill -9``) at a named point, for failure-window tests.

Off unless ``GT_CRASH_AT`` names the point. With ``GT_CRASH_MARKER`` set to a file path, the crash happens
only while that file does not exist, and the file is created first: a restarted process with the same
environment runs past the point, which is what a test of "crash here, then restart" needs.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

ENV_POINT = "GT_CRASH_AT"
ENV_MARKER = "GT_CRASH_MARKER"


def crash_point(name: str) -> None:
    """SIGKILL this process if ``GT_CRASH_AT`` is ``name`` (once per marker file, when one is given)."""
    if os.environ.get(ENV_POINT) != name:
        return
    marker = os.environ.get(ENV_MARKER)
    if marker:
        path = Path(marker)
        try:
            with path.open("x") as out:
                out.write(f"{name} pid {os.getpid()}\n")
        except FileExistsError:
            return
    log.warning("crash_point_reached", point=name, pid=os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)
