"""Keeping a service's environment from the code it runs: gates and agents run as the same OS user.

Only the standard library: a service calls it first thing (and a test runs it under a plain system Python).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

PR_SET_DUMPABLE = 4
PRIVATE_UMASK = 0o077
"""What every entry point (the services, ``gt``, ``gt up``, ``gt-agent``, the plugins) creates under GT_HOME (logs,
run files, the NATS store, clones, worktrees, archives) is its user's alone: they tell a lot about the town, and
nobody else on the machine needs them."""


def hide_environment() -> bool:
    """Make this process non-dumpable (Linux ``prctl(PR_SET_DUMPABLE, 0)``): its ``/proc/<pid>/environ`` (the
    service's NATS password) and memory are then readable by root only, no longer by a gate or an agent running
    as the same user. What it starts is dumpable again once it execs. False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes  # here: the entry points that never call this (gt-agent) start 2.5 ms sooner

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def private_files(env: Mapping[str, str] | None = None) -> int:
    """Set this process's umask, inherited by everything it starts: ``GT_UMASK`` (octal, e.g. ``007`` to share
    GT_HOME with a group, as agents running as another OS user need), else 077. Returns the umask set.

    Raises:
        ValueError: GT_UMASK is not an octal mode.
    """
    env = os.environ if env is None else env
    text = env.get("GT_UMASK", "").strip()
    mask = PRIVATE_UMASK
    if text:
        try:
            mask = int(text, 8)
        except ValueError:
            mask = -1
        if not 0 <= mask <= 0o777:
            raise ValueError(f"GT_UMASK must be an octal mode such as 077 or 007, got {text!r}")
    os.umask(mask)
    return mask
