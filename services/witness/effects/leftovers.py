"""Processes an ended session left behind, found before its worktree is handed to a new session.

Each pane runs its agent under ``shared.reaper``, which ends every process of the session, however detached, when
the session ends. This is the check that it did, and the cover where it could not: a reaper that runs as the
agent's own user (a laptop town) can be killed by the agent first, and then what the agent detached is
re-parented to init. A process of the old sessions is one that:

- is an old session's reaper (its pane's first process, by pid and start time) or below one;
- carries an old session's ``GT_SESSION`` in its environment (inherited by everything the agent starts, unless it
  scrubbed it);
- has its working directory, or a file open, in the worktree or an old session's runtime dir, and either has no
  controlling terminal (it detached: an operator's shell or editor in the worktree has one, and is left alone) or
  runs as the agents' own OS user (``GT_AGENT_USER``: nobody else's processes run as it).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import msgspec
import psutil

from shared import processes


class Leftover(msgspec.Struct, frozen=True, kw_only=True):
    ref: processes.ProcessRef
    name: str
    why: str


def find(
    *,
    roots: Sequence[processes.ProcessRef],
    sessions: Collection[str],
    paths: Sequence[str],
    agent_uid: int | None,
) -> list[Leftover]:
    """The processes of the sessions ``sessions`` still running (see the module's docstring)."""
    me = psutil.Process()
    spare = {me.pid, *(p.pid for p in me.parents()), *(p.pid for p in me.children(recursive=True))}
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

    for proc in psutil.process_iter(["pid", "name", "create_time", "terminal", "uids"]):
        pid = int(proc.info["pid"])
        if pid in spare or pid in found or proc.info.get("create_time") is None:
            continue
        why = _why(proc, sessions, inside, agent_uid)
        if why:
            ref = processes.ProcessRef(pid=pid, started=float(proc.info["create_time"]))
            found[pid] = Leftover(ref=ref, name=str(proc.info.get("name") or "?"), why=why)
    return list(found.values())


def _why(proc: psutil.Process, sessions: Collection[str], inside: Callable[[str], bool], agent_uid: int | None) -> str:
    try:
        if proc.environ().get("GT_SESSION") in sessions:
            return "carries an ended session's GT_SESSION"
    except (psutil.Error, OSError):
        pass  # another user's, or gone: judged by where it works below
    uids = proc.info.get("uids")
    detached = proc.info.get("terminal") is None
    if not detached and not (agent_uid is not None and uids is not None and uids.real == agent_uid):
        return ""
    try:
        cwd = proc.cwd()
        if cwd and inside(cwd):
            return f"works in {cwd}"
        for opened in proc.open_files():
            if inside(opened.path):
                return f"has {opened.path} open"
    except (psutil.Error, OSError):
        return ""
    return ""
