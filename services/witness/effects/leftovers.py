"""Processes an ended session left behind, found before its worktree is handed to a new session.

Each pane runs its agent under ``shared.host.reaper``, which ends every process of the session, however detached, when
the session ends. This is the check that it did, and the cover where it could not: a reaper that runs as the
agent's own user (a laptop town) can be killed by the agent first, and then what the agent detached is
re-parented to init. A process of the old sessions is one that:

- is an old session's reaper (its pane's first process, by pid and start time) or below one;
- carries an old session's ``GT_SESSION`` in its environment (inherited by everything the agent starts, unless it
  scrubbed it);
- has its working directory in the worktree or an old session's runtime dir, and either has no controlling
  terminal (it detached: an operator's shell or editor in the worktree has one, and is left alone) or runs as the
  agents' own OS user (``GT_AGENT_USER``: nobody else's processes run as it).

Only processes of the agents' user are looked into (with ``GT_AGENT_USER`` that user, else the witness's own), and
open files are not (reading every process's file table costs more than the rest of the scan many times over). The
scan reads ``/proc`` itself: a start waits for it, and psutil's ``process_iter`` costs about 150 us a process, kernel
threads included (10-25 ms on an idle machine, more on a laptop with hundreds of processes), where reading each
process's ``status`` and only its own user's environments costs a tenth of that.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator, Sequence

import msgspec
import psutil

from shared.host import processes

SESSION_VAR = b"GT_SESSION="


class Leftover(msgspec.Struct, frozen=True, kw_only=True):
    ref: processes.ProcessRef
    name: str
    why: str


def find(
    *,
    roots: Sequence[processes.ProcessRef],
    sessions: Collection[str],
    paths: Sequence[str],
    agent_uid: int,
) -> list[Leftover]:
    """The processes of the sessions ``sessions`` still running (see the module's docstring). Only processes of
    ``agent_uid`` (the user agents run as) are looked into: nobody else's can be an agent's."""
    me = psutil.Process()
    spare = {me.pid, *(p.pid for p in me.parents())}
    found: dict[int, Leftover] = {}
    for root in roots:
        if processes.is_alive(root):
            found[root.pid] = Leftover(ref=root, name="reaper", why="an ended session's pane process")
            for below in processes.descendants(root):
                found.setdefault(below.pid, Leftover(ref=below, name="?", why="below an ended session's pane"))
    prefixes = tuple(p.rstrip("/") + "/" for p in paths)
    exact = {p.rstrip("/") for p in paths}

    def inside(path: str) -> bool:
        return path in exact or path.startswith(prefixes)

    for pid, ppid in _processes_of(agent_uid):
        if pid in spare or pid in found or ppid == me.pid:
            continue  # the witness, what it runs now (git)
        why = _why(pid, sessions, inside, agent_uid)
        if not why:
            continue
        try:
            proc = psutil.Process(pid)
            ref = processes.ProcessRef(pid=pid, started=proc.create_time())
            name = proc.name()
        except psutil.Error:
            continue  # gone meanwhile
        found[pid] = Leftover(ref=ref, name=name or "?", why=why)
    return list(found.values())


def _processes_of(uid: int) -> Iterator[tuple[int, int]]:
    """(pid, parent pid) of every process whose real user is ``uid`` (``/proc/<pid>/status``: readable for every
    process, unlike its environment; its owner is not the real user)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as file:
                status = file.read()
        except OSError:
            continue  # gone meanwhile
        ppid = None
        for line in status.split(b"\n"):
            if line.startswith(b"PPid:"):
                ppid = int(line.split()[1])
            elif line.startswith(b"Uid:"):
                fields = line.split()
                if len(fields) > 1 and int(fields[1]) == uid and ppid is not None:
                    yield int(name), ppid
                break


def _why(pid: int, sessions: Collection[str], inside: Callable[[str], bool], agent_uid: int) -> str:
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            environ = file.read()
        for entry in environ.split(b"\0"):
            if entry.startswith(SESSION_VAR) and entry[len(SESSION_VAR) :].decode(errors="replace") in sessions:
                return "carries an ended session's GT_SESSION"
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""  # gone meanwhile (or a kernel thread)
    if not cwd or not inside(cwd):
        return ""
    if agent_uid != os.getuid() or _detached(pid):
        return f"works in {cwd}"
    return ""  # a process with a terminal, of the witness's own user: an operator's shell or editor


def _detached(pid: int) -> bool:
    """The process has no controlling terminal (``tty_nr`` 0 in ``/proc/<pid>/stat``): psutil's ``terminal()`` maps
    every terminal device to find its name, which costs more than the whole scan."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as file:
            fields = file.read().rpartition(")")[2].split()
    except OSError:
        return False
    return len(fields) > 4 and fields[4] == "0"
