"""The watcher a gate runs under: ``python -I .../watch.py SPEC`` (SPEC: a ``WatchSpec`` as JSON).
It makes a gate die with its refinery, even one killed with SIGKILL.

The refinery starts the watcher with a pipe on its stdin and never writes to it. The watcher starts the gate
(``sh -c``) in a process group and session of its own, records the group (``GateRecord``, for the
next refinery's sweep should the watcher die too) and waits for the first of: the gate ending, or its stdin
reaching end of file. The kernel closes the pipe when the refinery exits in any way, so end of file means the
refinery is gone (or gave up on the gate: a time-out): the watcher stops the gate's whole group, SIGTERM and
after a grace SIGKILL. When the gate ends by itself, whatever it left running in its group is killed too.

The gate's first process is not reaped until its group has been signalled: while it is a zombie its pid, which
is the group's id, cannot be taken by another process, so the group signal reaches the gate's processes only.

A script of the standard library, msgspec and psutil only (nothing of the project's), run by its path in isolated
mode (``-I``) from ``/``: it works however the project is installed, and imports nothing from the gate's working
directory or environment.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

import msgspec
import psutil

STOP_GRACE_S = 5.0
"""How long a gate told to stop (SIGTERM) has before its group is killed."""
TIMED_OUT = 124
"""The watcher's exit code when it stopped the gate (the refinery went away or timed it out)."""
MARKER_VARIABLE = "GT_GATE_RUN"
"""Set in every gate's environment to its run's marker (the watcher's own environment is the gate's)."""


class WatchSpec(msgspec.Struct, frozen=True, kw_only=True):
    argv: list[str]
    cwd: str
    record: str
    """Where the gate's ``GateRecord`` is kept while it runs."""
    marker: str
    """The value of ``MARKER_VARIABLE`` in the gate's environment."""
    uid: int | None = None
    gid: int | None = None
    """The gate user's ids, when gates run as another user (``GT_GATE_USER``)."""


class Leader(msgspec.Struct, frozen=True, kw_only=True):
    """The gate's first process, whose pid is its group's id: the shape of ``shared.host.processes.ProcessRef``."""

    pid: int
    started: float
    """psutil ``create_time()``."""


class GateRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A running gate's process group, as the watcher recorded it: its first process with its start time, and
    the marker every process of it inherits unless it clears its environment."""

    leader: Leader
    marker: str


class _Stop(Exception):
    """The watcher was told to stop (SIGTERM, SIGINT, SIGHUP)."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def _stop_group(pgid: int, pidfd: int) -> None:
    """SIGTERM the group; SIGKILL it once its first process ended or after the grace. The first process is not
    reaped here, so ``pgid`` is still this group's."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))
        if ready:
            break
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def watch(spec: WatchSpec) -> int:
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _raise_stop)
    try:
        gate = subprocess.Popen(
            spec.argv,
            cwd=spec.cwd,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            user=spec.uid,
            group=spec.gid,
            extra_groups=[] if spec.uid is not None else None,
        )
    except _Stop:
        return TIMED_OUT
    pgid = gate.pid
    pidfd = os.pidfd_open(pgid)
    record = Path(spec.record)
    stopped = False
    try:
        with contextlib.suppress(psutil.Error):
            leader = Leader(pid=pgid, started=psutil.Process(pgid).create_time())
            tmp = record.with_name(record.name + ".tmp")
            tmp.write_bytes(msgspec.json.encode(GateRecord(leader=leader, marker=spec.marker)))
            tmp.replace(record)
        while True:
            ready, _, _ = select.select([sys.stdin.fileno(), pidfd], [], [])
            if pidfd in ready:
                break
            if not os.read(sys.stdin.fileno(), 4096):
                stopped = True  # the refinery is gone, or gave up on the gate
                break
    except _Stop:
        stopped = True
    # From here on the watcher finishes its job whatever it is sent.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    if stopped:
        _stop_group(pgid, pidfd)
    else:
        os.waitid(os.P_PID, pgid, os.WEXITED | os.WNOWAIT)  # ended, not reaped: the group id is still its
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)  # what it left running in its group
    _, status = os.waitpid(pgid, 0)
    os.close(pidfd)
    record.unlink(missing_ok=True)
    return TIMED_OUT if stopped else _exit_code(status)


def main() -> None:
    sys.exit(watch(msgspec.json.decode(sys.argv[1].encode(), type=WatchSpec)))


if __name__ == "__main__":
    main()
