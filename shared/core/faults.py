"""Crash points: a service kills itself (SIGKILL, like ``kill -9``) at a named point, for failure-window tests.

Off unless ``GT_CRASH_AT`` names the point. With ``GT_CRASH_MARKER`` set to a file path, the crash happens
only while that file does not exist, and the file is created first: a restarted process with the same
environment runs past the point, which is what a test of "crash here, then restart" needs.

Hold points: a service's step waits at a named point while a file exists (``GT_HOLD_AT``, ``GT_HOLD_FILE``), so
that a test lets the world move on past a slow step (the rest of the service runs on meanwhile).
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

ENV_POINT = "GT_CRASH_AT"
ENV_MARKER = "GT_CRASH_MARKER"
ENV_HOLD_POINT = "GT_HOLD_AT"
ENV_HOLD_FILE = "GT_HOLD_FILE"
HOLD_POLL_S = 0.05


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


async def hold_point(name: str) -> None:
    """Wait while ``GT_HOLD_FILE`` exists if ``GT_HOLD_AT`` is ``name``."""
    if os.environ.get(ENV_HOLD_POINT) != name:
        return
    held = os.environ.get(ENV_HOLD_FILE, "")
    if os.path.exists(held):  # noqa: ASYNC240 - a test's marker file, one stat
        log.warning("hold_point_reached", point=name, pid=os.getpid())
    while os.path.exists(held):  # noqa: ASYNC110, ASYNC240 - a file another process removes: nothing to await
        await asyncio.sleep(HOLD_POLL_S)
