"""Processes by identity: a pid plus its start time, re-verified right before any signal (pids are reused).

The only module besides the witness's own adapters that imports psutil.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

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


def send_signal(ref: ProcessRef, sig: signal.Signals) -> bool:
    """Signal the process ``ref`` names, only if it still is that process; True when signalled.

    Through a pidfd where the platform has one: the pidfd is opened first and the identity checked after,
    so the signal cannot reach a process that took the pid in between.
    """
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(ref.pid)
        except (ProcessLookupError, OSError):
            return False
        try:
            if not is_alive(ref):
                return False
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, sig)
                return True
            return False
        finally:
            os.close(fd)
    if not is_alive(ref):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(ref.pid, sig)
        return True
    return False


def stop(ref: ProcessRef, *, timeout: float = 10.0) -> bool:
    """SIGTERM the process, then SIGKILL after ``timeout``; each signal only after re-verifying identity.

    Returns True when the process is gone (or was never there), False if it outlived SIGKILL.
    """
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        if not send_signal(ref, sig):
            return not is_alive(ref)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not is_alive(ref):
                return True
            time.sleep(0.05)
    return not is_alive(ref)


def descendants(ref: ProcessRef) -> list[ProcessRef]:
    """The processes below ``ref`` now (children, their children, ...), each with its start time."""
    if not is_alive(ref):
        return []
    out: list[ProcessRef] = []
    try:
        children = psutil.Process(ref.pid).children(recursive=True)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
            out.append(ProcessRef(pid=child.pid, started=child.create_time()))
    return out


def stop_tree(ref: ProcessRef, *, timeout: float = 10.0) -> bool:
    """Stop ``ref`` and everything below it (an agent under its pane's shell): SIGTERM to all, SIGKILL to
    what is left after ``timeout``; every signal only to a process re-verified by pid and start time.

    Returns True when all of them are gone.
    """
    return stop_all([ref, *descendants(ref)], timeout=timeout)


def stop_all(refs: list[ProcessRef], *, timeout: float = 10.0) -> bool:
    """Stop every process of ``refs`` at once: SIGTERM to all, SIGKILL to what is left after ``timeout``; every
    signal only to a process re-verified by pid and start time. Returns True when all of them are gone."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        living = [p for p in refs if is_alive(p)]
        if not living:
            return True
        for proc in living:
            send_signal(proc, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(is_alive(p) for p in living):
            time.sleep(0.05)
    return not any(is_alive(p) for p in refs)


def working_in(path: Path) -> list[tuple[int, str]]:
    """(pid, name) of every live process whose working directory is ``path`` or below it."""
    root = str(path.resolve())
    found = []
    for proc in psutil.process_iter(["pid", "name", "cwd"]):
        cwd = proc.info.get("cwd")
        if cwd and (cwd == root or cwd.startswith(root + "/")):
            found.append((int(proc.info["pid"]), str(proc.info.get("name") or "?")))
    return found


def pid_namespace_id() -> str:
    """This process's boot and pid namespace ("" when unknown): two processes whose values are equal see the
    same pids, so one may judge whether the other's pid (with its start time) still runs. Containers on one
    host share the boot id but not the pid namespace."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{boot}/{namespace}" if boot and namespace else ""


def group_members(pgid: int) -> list[ProcessRef]:
    """Every live process whose process group is ``pgid``, each with its start time."""
    out: list[ProcessRef] = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) != pgid:
                continue
        except (ProcessLookupError, PermissionError):
            continue
        ref = ref_of(pid)
        if ref is not None:
            out.append(ref)
    return out


def environ_value(ref: ProcessRef, name: str) -> str | None:
    """The value of ``name`` in the environment the process ``ref`` names started with (None when it is not set,
    the process is gone or its environment cannot be read)."""
    try:
        proc = psutil.Process(ref.pid)
        if abs(proc.create_time() - ref.started) > START_TIME_TOLERANCE_S:
            return None
        value = proc.environ().get(name)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None
    return str(value) if value is not None else None
