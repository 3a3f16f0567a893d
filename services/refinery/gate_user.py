"""Gates as another OS user (``GT_GATE_USER``): what lets the refinery run code an agent wrote without handing
it the refinery's files (its NATS password file, GT_HOME, the rig clones and their remotes).

The refinery must run as root to start processes as another user; it starts only the gates that way. A gate
never runs in the refinery's worktree (inside GT_HOME, private): each probe gets a scratch directory of the
gate user's, outside GT_HOME, holding

- ``work/``: a copy of the worktree's files (no ``.git``: neither the refinery's repository nor its remotes),
  unpacked *by the gate user* from a tar stream the refinery writes, so the refinery never changes the
  ownership of anything an agent committed (a symlink to a secret stays a symlink the gate cannot follow to
  anything it could not read anyway);
- ``home/`` and ``tmp/``: the gate's ``HOME`` and ``TMPDIR``, fresh each time, so one merge request's gate
  leaves nothing (a shell profile, a poisoned cache) for the next.

The copy is thrown away after the probe: the refinery's own worktree, which it rebases and pushes from, is
never touched by a gate. Adapter: reads the user database, runs tar.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

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
    """A scratch directory of ``user`` holding a copy of ``work``'s files (``work/``), ``home/`` and ``tmp/``;
    removed afterwards. Yields the scratch directory."""
    # In the system's temporary directory: one the gate user can reach (GT_HOME is private). mkdtemp makes it
    # 0700 and root's: nobody else can swap it for a symlink before it is handed over.
    scratch = Path(tempfile.mkdtemp(prefix=f"gt-gate-{user.name}-"))
    try:
        os.chmod(scratch, 0o700)
        if user.switch:
            os.chown(scratch, user.uid, user.gid, follow_symlinks=False)
        _copy_tree(user, work, scratch)
        yield scratch
    finally:
        _remove(scratch)


def _copy_tree(user: GateUser, work: Path, scratch: Path) -> None:
    """``work``'s files (not ``.git``), written into ``scratch/work`` by the gate user itself."""
    plain = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C"}
    pack = ["tar", "-c", "-f", "-", "--exclude=./.git", "-C", str(work), "."]
    unpack = ["sh", "-c", "mkdir -m 700 work home tmp && exec tar -x -f - -C work --no-same-owner"]
    with subprocess.Popen(pack, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=plain) as reader:
        assert reader.stdout is not None
        assert reader.stderr is not None
        unpacked = subprocess.run(
            unpack,
            cwd=scratch,
            stdin=reader.stdout,
            capture_output=True,
            env=plain,
            timeout=COPY_TIMEOUT_S,
            check=False,
            **user.process_options(),
        )
        reader.stdout.close()
        packed_err = reader.stderr.read()
        packed = reader.wait(timeout=COPY_TIMEOUT_S)
    if packed != 0 or unpacked.returncode != 0:
        said = (packed_err + unpacked.stderr).decode(errors="replace").strip()
        raise RuntimeError(f"could not copy the worktree for the gate user {user.name}: {said}")


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
