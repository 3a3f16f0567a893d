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

A script of the standard library only (nothing of the project's, no site packages), run by its path in isolated
mode without ``site`` (``-I -S``) from ``/``: it works however the project is installed, imports nothing from the
gate's working directory or environment, and starts in tens of milliseconds (msgspec and psutil took 0.35-0.5 s to
import on a loaded 2-core machine, paid by every gate). Its spec and record are ``records``' shapes, as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

STOP_GRACE_S = 5.0
"""How long a gate told to stop (SIGTERM) has before its group is killed."""
TIMED_OUT = 124
"""The watcher's exit code when it stopped the gate (the refinery went away or timed it out)."""
MARKER_VARIABLE = "GT_GATE_RUN"
"""Set in every gate's environment to its run's marker (the watcher's own environment is the gate's)."""


def start_time(pid: int) -> float:
    """When process ``pid`` started, in seconds since the epoch, as psutil's ``create_time()`` reckons it (its
    start in clock ticks after boot, ``/proc/<pid>/stat``, plus the boot time, ``/proc/stat``): what
    ``shared.host.processes`` compares a record with.

    Raises:
        OSError: no such process (or no /proc).
    """
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may hold spaces and parentheses: the fields after it follow the last ")".
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = int(fields[19])  # field 22, starttime
    boot = next(
        int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
    )
    return ticks / os.sysconf("SC_CLK_TCK") + boot


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


def watch(spec: dict[str, Any]) -> int:
    """Run the gate ``spec`` describes (a ``records.WatchSpec`` as JSON, read with the standard library)."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _raise_stop)
    try:
        gate = subprocess.Popen(
            spec["argv"],
            cwd=spec["cwd"],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            user=spec.get("uid"),
            group=spec.get("gid"),
            extra_groups=[] if spec.get("uid") is not None else None,
        )
    except _Stop:
        return TIMED_OUT
    pgid = gate.pid
    pidfd = os.pidfd_open(pgid)
    record = Path(spec["record"])
    stopped = False
    try:
        with contextlib.suppress(OSError, ValueError, IndexError, StopIteration):
            record_json = {"leader": {"pid": pgid, "started": start_time(pgid)}, "marker": spec["marker"]}
            tmp = record.with_name(record.name + ".tmp")
            tmp.write_text(json.dumps(record_json))
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
    sys.exit(watch(json.loads(sys.argv[1])))


if __name__ == "__main__":
    main()
