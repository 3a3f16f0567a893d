"""Gates as another OS user (``GT_GATE_USER``): what lets the refinery run code an agent wrote without handing
it the refinery's files (its NATS password file, GT_HOME, the rig clones and their remotes).

The refinery must run as root to start processes as another user; it starts only the gates that way. A gate
never runs in the refinery's worktree (inside GT_HOME, private): each probe gets a scratch directory of the
gate user's, outside GT_HOME, holding

- ``work/``: a shallow clone of the commit the worktree has checked out (the same commit, so ``git log`` and
  version tools work; none of the refinery's repository: no other history, branches, remotes or their URLs),
  built while only root can enter the scratch directory and then handed over with ``lchown`` (a symlink an
  agent committed is never followed, so it cannot make a secret the gate user's);
- ``home/`` and ``tmp/``: the gate's ``HOME`` and ``TMPDIR``, fresh each time, so one merge request's gate
  leaves nothing (a shell profile, a poisoned cache) for the next.

The copy is thrown away after the probe: the refinery's own worktree, which it rebases and pushes from, is
never touched by a gate. Adapter: reads the user database, runs git, changes owners.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from shared.host import git, os_user
from shared.host.os_user import OsUser

COPY_TIMEOUT_S = 600.0


GateUser = OsUser
"""The OS user gates run as (``GT_GATE_USER``), resolved once at start-up."""


def gate_user_environment(user: GateUser, base: dict[str, str], scratch: Path) -> dict[str, str]:
    """``base`` (the allowlisted environment) with the gate user's identity, home and temp directory."""
    return {
        **base,
        "HOME": str(scratch / "home"),
        "TMPDIR": str(scratch / "tmp"),
        "USER": user.name,
        "LOGNAME": user.name,
    }


def resolve(name: str, *, euid: int | None = None) -> GateUser | None:
    """The gate user named by ``GT_GATE_USER`` (None when unset); ValueError when it cannot be used."""
    return os_user.resolve("GT_GATE_USER", name, service="refinery", what="gates", euid=euid)


@contextlib.contextmanager
def workspace(user: GateUser, work: Path) -> Iterator[Path]:
    """A scratch directory of ``user`` holding a clone of what ``work`` has checked out (``work/``), ``home/`` and
    ``tmp/``; removed afterwards. Yields the scratch directory."""
    # In the system's temporary directory: one the gate user can reach (GT_HOME is private). mkdtemp makes it
    # 0700 and root's: the gate user cannot touch anything in it until it is complete and handed over.
    scratch = Path(tempfile.mkdtemp(prefix=f"gt-gate-{user.name}-"))
    try:
        _clone(work, scratch / "work")
        for name in ("home", "tmp"):
            (scratch / name).mkdir(mode=0o700)
        if user.switch:
            # The scratch directory itself stays root's (passable, 0711): a gate cannot rename it in /tmp and put a
            # link in its place for the removal to follow; it gets what is inside.
            for name in ("work", "home", "tmp"):
                user.hand_over(scratch / name)
            scratch.chmod(0o711)
        yield scratch
    finally:
        git.force_remove(scratch)


def _clone(work: Path, dest: Path) -> None:
    """A shallow clone of ``work``'s checked-out commit: the same commit (``git log``, version tools work) and
    files, none of the refinery's repository (its history, other branches, remotes and their URLs)."""
    git.git("clone", "--quiet", "--depth", "1", "--", f"file://{work}", str(dest), timeout=COPY_TIMEOUT_S)
    git.git("remote", "remove", "origin", cwd=dest)
