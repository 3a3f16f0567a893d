"""Processes by identity: a pid plus its start time, re-verified right before any signal (pids are reused).

The only module besides the witness's own adapters that imports psutil.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import msgspec
import psutil

START_TIME_TOLERANCE_S = 0.05


class ProcessRef(msgspec.Struct, frozen=True, kw_only=True):
    """A process as it was when we met it; ``started`` tells it apart from a later one with the same pid."""

    pid: int
    started: float
    """psutil ``create_time()``: seconds since the epoch."""


def ref_of(pid: int) -> ProcessRef | None:
    """The running process ``pid`` as a ref, or None when there is none."""
    try:
        return ProcessRef(pid=pid, started=psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def is_alive(ref: ProcessRef) -> bool:
    """True when the very process ``ref`` names still runs (not a zombie, not a newcomer with its pid)."""
    try:
        proc = psutil.Process(ref.pid)
        if abs(proc.create_time() - ref.started) > START_TIME_TOLERANCE_S:
            return False
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def stop(ref: ProcessRef, *, timeout: float = 10.0) -> bool:
    """SIGTERM the process, then SIGKILL after ``timeout``; each signal only after re-verifying identity.

    Returns True when the process is gone (or was never there), False if it outlived SIGKILL.
    """
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        if not is_alive(ref):
            return True
        with contextlib.suppress(ProcessLookupError):
            os.kill(ref.pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not is_alive(ref):
                return True
            time.sleep(0.05)
    return not is_alive(ref)
