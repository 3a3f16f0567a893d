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
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from shared import git

COPY_TIMEOUT_S = 600.0


class GateUser(msgspec.Struct, frozen=True, kw_only=True):
    """The OS user gates run as, resolved once at start-up."""

    name: str
    uid: int
    gid: int
    switch: bool
    """True when the refinery (root) must switch to this user; False when it already runs as it."""

    def process_options(self) -> dict[str, Any]:
        """``subprocess`` arguments that start a process as this user with only its own group."""
        if not self.switch:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def environment(self, base: dict[str, str], scratch: Path) -> dict[str, str]:
        """``base`` (the allowlisted environment) with the gate user's identity, home and temp directory."""
        return {
            **base,
            "HOME": str(scratch / "home"),
            "TMPDIR": str(scratch / "tmp"),
            "USER": self.name,
            "LOGNAME": self.name,
        }


def resolve(name: str, *, euid: int | None = None) -> GateUser | None:
    """The gate user named by ``GT_GATE_USER`` (None when unset). Raises ValueError, naming the setting and what
    to do, when it cannot be used: no such user, root itself, or a refinery that is not root naming another."""
    if not name:
        return None
    euid = os.geteuid() if euid is None else euid
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ValueError(
            f"GT_GATE_USER={name}: no such user on this host; create it (useradd --system {name}) or unset GT_GATE_USER"
        ) from None
    if entry.pw_uid == 0:
        raise ValueError(f"GT_GATE_USER={name}: that is root; name an unprivileged user gates may run as")
    if euid != 0 and entry.pw_uid != euid:
        try:
            me = pwd.getpwuid(euid).pw_name
        except KeyError:
            me = str(euid)
        raise ValueError(
            f"GT_GATE_USER={name}: the refinery runs as {me}, not root, so it cannot start gates as another "
            f"user; run the refinery as root (only its gates then run as {name}) or unset GT_GATE_USER"
        )
    return GateUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid, switch=entry.pw_uid != euid)


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
            _hand_over(scratch, user)
        yield scratch
    finally:
        _remove(scratch)


def _clone(work: Path, dest: Path) -> None:
    """A shallow clone of ``work``'s checked-out commit: the same commit (``git log``, version tools work) and
    files, none of the refinery's repository (its history, other branches, remotes and their URLs)."""
    git.git("clone", "--quiet", "--depth", "1", "--", f"file://{work}", str(dest), timeout=COPY_TIMEOUT_S)
    git.git("remote", "remove", "origin", cwd=dest)


def _hand_over(scratch: Path, user: GateUser) -> None:
    """Give the gate user everything under ``scratch``, then ``scratch`` itself. Links are changed themselves,
    never followed (a symlink an agent committed may point at a secret), and nothing is hard-linked (a fresh
    clone's files are its own)."""
    for root, dirs, files in os.walk(scratch):  # does not enter a symlink to a directory
        for name in (*dirs, *files):
            os.chown(os.path.join(root, name), user.uid, user.gid, follow_symlinks=False)
    os.chown(scratch, user.uid, user.gid, follow_symlinks=False)


def _remove(scratch: Path) -> None:
    """Remove the scratch directory, whatever the gate left in it (read-only files, a symlink in its place)."""
    if scratch.is_symlink():
        scratch.unlink()
        return
    shutil.rmtree(scratch, ignore_errors=True)
    if scratch.exists():
        for root, dirs, _files in os.walk(scratch):
            for name in dirs:
                path = os.path.join(root, name)
                if not os.path.islink(path):
                    os.chmod(path, 0o700)
        shutil.rmtree(scratch, ignore_errors=True)
