"""Gates as processes that never outlive their refinery: each runs under a watcher (``watch``) that stops
its whole process group when the refinery goes away, however it goes; the watcher itself runs under the reaper a
polecat pane's agent runs under (``shared.host.reaper``), so a process of the gate's that left its group (``setsid``: a
gate runs the code of the change it checks) is stopped too once the watcher is done; and a refinery starting stops
what a gate whose watcher died as well left running, from the records the watchers keep, before it does anything
else.

A leftover is stopped only when it is verified to be the recorded gate's: in the recorded process group, and
either that group's first process still runs (by pid and start time: while it runs nobody else can have the
group's id) or the process carries the gate's marker in its environment. Every signal goes through a pidfd after
that check (``shared.host.processes.send_signal``), so a process that took a pid meanwhile is never signalled.
Adapter: starts and signals processes, reads ``/proc``.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import msgspec
import structlog

from shared.host import processes, reaper
from shared.host.gates import watch
from shared.host.gates.records import GateRecord, WatchSpec
from shared.host.gates.watch import MARKER_VARIABLE, STOP_GRACE_S
from shared.host.os_user import OsUser

log = structlog.get_logger(__name__)

WATCHER = str(Path(watch.__file__).resolve())
"""The watcher's script, run by its path (see ``watch``)."""
WATCHER_EXIT_S = STOP_GRACE_S + 10.0
"""How long a watcher told to stop is given to stop its gate and exit."""
STOP_POLL_S = 0.2
"""How often a gate that may be stopped (``stop``) looks whether it is."""


def run(
    argv: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    out: BinaryIO,
    timeout: float,
    records: Path,
    as_user: OsUser | None = None,
    stop: threading.Event | None = None,
) -> int | None:
    """Run ``argv`` under a watcher, its output in ``out``; its exit code, or None when it ran past ``timeout`` or
    ``stop`` was set (it is stopped then, with everything it started)."""
    records.mkdir(parents=True, exist_ok=True)
    marker = uuid.uuid4().hex
    switch = as_user is not None and as_user.switch
    spec = WatchSpec(
        argv=argv,
        cwd=str(cwd),
        record=str(records / f"{marker}.json"),
        marker=marker,
        uid=as_user.uid if switch and as_user is not None else None,
        gid=as_user.gid if switch and as_user is not None else None,
    )
    watcher = subprocess.Popen(
        [*reaper.argv(STOP_GRACE_S), sys.executable, "-I", "-S", WATCHER, msgspec.json.encode(spec).decode()],
        cwd="/",
        env={**env, MARKER_VARIABLE: marker},
        stdin=subprocess.PIPE,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    try:
        return _wait(watcher, timeout, stop)
    finally:
        if watcher.poll() is None:
            assert watcher.stdin is not None
            watcher.stdin.close()  # end of file: the watcher stops the gate's group
            try:
                watcher.wait(WATCHER_EXIT_S)
            except subprocess.TimeoutExpired:
                watcher.kill()
                watcher.wait()
        if watcher.stdin is not None:
            watcher.stdin.close()


def _wait(watcher: subprocess.Popen[bytes], timeout: float, stop: threading.Event | None) -> int | None:
    """The watcher's exit code, or None once ``timeout`` passed or ``stop`` was set."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or (stop is not None and stop.is_set()):
            return None
        try:
            return watcher.wait(left if stop is None else min(left, STOP_POLL_S))
        except subprocess.TimeoutExpired:
            continue


def _leftovers(record: GateRecord) -> list[processes.ProcessRef]:
    """The processes of the recorded gate's group that are verified to be its (see the module's docstring)."""
    members = processes.group_members(record.leader.pid)
    if processes.is_alive(processes.ProcessRef(pid=record.leader.pid, started=record.leader.started)):
        # Its first process still runs: the group id is not free, so every member is the gate's. Checked after
        # listing them, so none listed can belong to a group that took the id later.
        return members
    return [ref for ref in members if processes.environ_value(ref, MARKER_VARIABLE) == record.marker]


def stop_leftovers(records: Path) -> list[int]:
    """Stop every process a gate recorded in ``records`` left running (its watcher died with the refinery),
    SIGTERM then SIGKILL, and verify they are gone; the pids stopped. A record is removed once nothing of its gate
    runs; one whose processes would not die stays, for the next start to try again, and is logged."""
    if not records.is_dir():
        return []
    stopped: list[int] = []
    for path in sorted(records.glob("*.json")):
        try:
            record = msgspec.json.decode(path.read_bytes(), type=GateRecord)
        except (OSError, msgspec.DecodeError):
            path.unlink(missing_ok=True)  # a record cut short by the crash: its watcher had not recorded the gate
            continue
        found = _leftovers(record)
        for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
            living = [ref for ref in found if processes.send_signal(ref, sig)]
            deadline = time.monotonic() + wait
            while living and time.monotonic() < deadline:
                time.sleep(0.05)
                living = [ref for ref in living if processes.is_alive(ref)]
            if not living:
                break
        alive = [ref.pid for ref in found if processes.is_alive(ref)]
        if alive:
            log.warning("leftover_gate_not_stopped", record=path.name, pids=alive)
            continue
        stopped += [ref.pid for ref in found]
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    for tmp in records.glob("*.json.tmp"):
        tmp.unlink(missing_ok=True)
    return stopped
