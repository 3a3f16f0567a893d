"""Keeping a service's environment from the code it runs: gates and agents run as the same OS user.

Only the standard library: a service calls it first thing (and a test runs it under a plain system Python).
"""

from __future__ import annotations

import ctypes
import sys

PR_SET_DUMPABLE = 4


def hide_environment() -> bool:
    """Make this process non-dumpable (Linux ``prctl(PR_SET_DUMPABLE, 0)``): its ``/proc/<pid>/environ`` (the
    service's NATS password) and memory are then readable by root only, no longer by a gate or an agent running
    as the same user. What it starts is dumpable again once it execs. False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False
