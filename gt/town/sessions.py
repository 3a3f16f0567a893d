"""The polecat sessions a town leaves in tmux: found, stopped by ``gt down --sessions``, their worktrees cleaned
by ``gt down --clean``."""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import time

from gt.cli import client
from gt.town.policy import DEFAULT_TMUX_SOCKET, DOWN_TIMEOUT_S, POLECAT_TMUX_PREFIX
from shared.bus.connection import connect
from shared.bus.query import ask
from shared.core.config import TownConfig, town_mark
from shared.core.errors import (
    GastownError,
)
from shared.host import git, processes
from shared.host.tmux import Tmux, TmuxError
from shared.model.commands import SessionStop
from shared.model.queries import witness
from shared.model.runtimes import SESSION_TOWN_PATIENCE_S
from shared.model.sessions import may_linger


def sessions_left_running(count: int) -> str:
    """What ``gt down`` says of the polecat sessions it leaves running: what really becomes of them."""
    one = count == 1
    return (
        f"{count} polecat session{'' if one else 's'} {'keeps' if one else 'keep'} running in tmux "
        f"(`tmux -L {tmux_socket()} ls`) and {'goes' if one else 'go'} on working; {'its' if one else 'their'} "
        f"`gt` calls wait up to {SESSION_TOWN_PATIENCE_S:g} s for the town (GT_TOWN_PATIENCE; gt-agent's an hour), "
        "so a `gt up` within that loses nothing. A session left longer without the town fails its call and may "
        "stop; once the town is back, the witness gives its bead a fresh session when its hook lease runs out "
        f"(the rig's stall_after). `gt down --sessions` stops {'it' if one else 'them'} with the town."
    )


def end_sessions_without_town(config: TownConfig) -> int:
    """End this town's polecat tmux sessions while no town runs (nothing can record it): each pane's reaper ends
    every process of its session when tmux closes the pane; waited for until none is left. How many were ended."""
    tmux = Tmux(tmux_socket(), town=town_mark(config))
    names = polecat_tmux_sessions(config)
    for name in names:
        tmux.kill(name)
    deadline = time.monotonic() + DOWN_TIMEOUT_S
    while polecat_tmux_sessions(config) and time.monotonic() < deadline:
        time.sleep(0.1)
    return len(names)


def tmux_socket() -> str:
    """The tmux server polecat sessions run on (the witness's ``GT_TMUX_SOCKET``)."""
    return os.environ.get("GT_TMUX_SOCKET") or DEFAULT_TMUX_SOCKET


def polecat_tmux_sessions(config: TownConfig) -> list[str]:
    """Names of this town's polecat tmux sessions running now (none when tmux is not there); another town's on the
    same socket are not counted."""
    try:
        panes = Tmux(tmux_socket(), town=town_mark(config)).snapshot()
    except (TmuxError, OSError):
        return []
    return sorted(name for name, pane in panes.items() if name.startswith(POLECAT_TMUX_PREFIX) and not pane.dead)


async def stop_sessions(config: TownConfig) -> int:
    """Have the witness stop every active polecat session (``gt.cmd.session.stop``: a warrant, a kill re-verified
    against the recorded process, ``session.ended`` with reason ``stopped``) and wait until each has ended, and
    until the witness has ended the panes of sessions that ran `gt done` (their agents may still run, for up to
    ``GT_DONE_EXIT_GRACE``, and nothing would end them with the town down); how many were stopped."""
    nc = await connect(config, name="gt-down", connect_attempts=2)
    try:
        active = await ask(nc, witness.Sessions(), timeout=10)
        ids = [s.id for s in active]
        for session_id in ids:
            cmd = SessionStop(session=session_id, cmd_id=f"stop-{session_id}-{secrets.token_hex(4)}")
            outcome = await client.send(nc, config, cmd, timeout=30)
            if (rejected := outcome.rejected) is not None:
                raise GastownError(f"session {session_id}: {rejected.message}")
        deadline = time.monotonic() + DOWN_TIMEOUT_S
        told = False
        while True:
            shown = await ask(nc, witness.Sessions(all=True), timeout=10)
            left = {s.id for s in shown if s.id in ids and s.status != "ended"}
            lingering = sorted(s.id for s in shown if may_linger(s))
            if not left and not lingering:
                return len(ids)
            if lingering and not told:
                print(
                    f"waiting for {len(lingering)} session{'s' if len(lingering) != 1 else ''} that ran `gt done` to "
                    f"exit ({', '.join(lingering)}; the witness ends them after GT_DONE_EXIT_GRACE)",
                    file=sys.stderr,
                )
                told = True
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"sessions still running after {DOWN_TIMEOUT_S:g}s: {', '.join(sorted({*left, *lingering}))}"
                )
            await asyncio.sleep(0.2)
    finally:
        await nc.close()


def clean_worktrees(config: TownConfig) -> int:
    """Remove every polecat worktree that is clean and fully pushed; keep and list the rest. The town is down,
    so nothing is working in them."""
    rigs = config.gt_home / "rigs"
    removed, kept = 0, []
    for rig in sorted(rigs.iterdir()) if rigs.exists() else []:
        bare = rig / "repo.git"
        polecats = rig / "polecats"
        if not polecats.is_dir() or not bare.exists():
            continue
        for path in sorted(polecats.iterdir()):
            try:
                state = git.worktree_state(path, "main")
                if not state.exists:
                    continue
                busy = processes.working_in(path)
                if busy:
                    users = ", ".join(f"{name} (pid {pid})" for pid, name in busy)
                    kept.append(f"worktree {path} is in use by {users}; it is kept")
                    continue
                git.remove_worktree(bare, path, "main")
                removed += 1
            except git.WorktreeNotEmptyError as exc:
                kept.append(str(exc))
            except git.GitError as exc:
                kept.append(f"worktree {path} could not be removed ({exc}); it is kept")
    print(f"removed {removed} clean worktree(s)")
    for line in kept:
        print(f"gt: {line}", file=sys.stderr)
    return 0
