"""Gates as another OS user (``GT_GATE_USER``): what lets the refinery run code an agent wrote without handing
it the refinery's files (its NATS password file, GT_HOME, the rig clones and their remotes).

The refinery must run as root to start processes as another user; it starts only the gates that way. A gate
never runs in the refinery's own workspace (inside GT_HOME, private). Each rig has a gate workspace of the gate
user's, outside GT_HOME (``GateWorkspaces``: ``<tmp>/gt-gates-<town>/<rig>/``, the town's directory and the rig's
root's and 0711), kept from one merge to the next:

- ``mirror.git``: root's, readable by the gate user: the commits gated so far, pushed there from the refinery's
  clone (none of its other history, branches, remotes or their URLs);
- ``work/``: the gate user's repository borrowing the mirror's objects, checked out at each candidate with a
  checkout whose cost follows the change; before that its ``.git`` is made anew by root with the index kept from
  root's last checkout (``repository_renewal``): nothing a gate wrote in it (config, hooks, objects, a forged
  index) reaches the next gate's checkout; what git does not track is removed, ignored files (build caches,
  installed dependencies) kept unless the rig is pristine;
- ``home/`` (kept, unless pristine) and ``tmp/`` (fresh every time): the gate's ``HOME`` and ``TMPDIR``.

Nothing of a gate outlives it (``runs``), so between gates nobody but the refinery touches the workspace.
A pristine rig gets everything made afresh for each probe (a copy of the whole tree: slower). Adapter: reads the
user database, runs git, changes owners.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from shared.host import git, os_user, repository_renewal
from shared.host.os_user import OsUser

CHECKOUT_TIMEOUT_S = 600.0


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


class UnsafeGateDirectoryError(OSError):
    """The town's gate directory exists but is not root's own (someone else made it first, or a link)."""


def town_directory(rigs_root: Path) -> Path:
    """Where a town's gate workspaces live: in the system's temporary directory (the gate user cannot reach GT_HOME),
    named after the town (``rigs_root``) so two towns on one host keep theirs apart."""
    digest = hashlib.sha256(str(rigs_root.resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"gt-gates-{digest}"


class GateWorkspaces:
    """The gate user's persistent workspace per rig (see the module's docstring)."""

    def __init__(self, user: GateUser, root: Path) -> None:
        self.user, self.root = user, root
        self._trusted: dict[str, bytes] = {}
        """Rig -> the index root's last checkout in its ``work/`` wrote (in memory: a refinery starting anew makes
        each workspace's repository from scratch once)."""
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def prepared(self, rig: str, bare: Path, commit: str, *, pristine: bool) -> Iterator[Path]:
        """The rig's gate directory with ``work/`` at exactly ``commit`` (of the refinery's clone ``bare``),
        ``home/`` and an empty ``tmp/``. Yields the directory."""
        with self._lock:
            place = self._rig_directory(rig)
        mirror = place / "mirror.git"
        resolved = git.resolve_commit(bare, commit)
        _mirror(bare, mirror, resolved)
        work = place / "work"
        trusted = None if pristine else self._trusted.pop(rig, None)
        if trusted is None or not (work / ".git").exists():
            self._make(place, mirror, resolved)
        else:
            self._move(place, mirror, resolved, trusted)
        self._trusted[rig] = repository_renewal.read_index(work)
        for name in ("home", "tmp") if pristine else ("tmp",):
            git.force_remove(place / name)
            if (place / name).exists() or (place / name).is_symlink():
                raise git.GitError(["workspace", str(place / name)], 1, f"{place / name} could not be made afresh")
        for name in ("home", "tmp"):
            if not (place / name).is_dir():
                (place / name).mkdir(mode=0o700)
                self.user.hand_over(place / name)
        yield place

    def _rig_directory(self, rig: str) -> Path:
        """``root/<rig>``, made root's and 0711 (the gate user may pass, not list or write); refused when it is
        there and not root's own."""
        for path in (self.root, self.root / rig):
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o711)
            found = os.lstat(path)
            if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o022:
                raise UnsafeGateDirectoryError(
                    f"{path} is not a directory of the refinery's own (uid {found.st_uid}, mode "
                    f"{stat.filemode(found.st_mode)}): remove it, or set TMPDIR to another place for the refinery"
                )
            os.chmod(path, 0o711)  # noqa: S103 -- passable, never listable or writable: the gate user reaches its own dirs
        return self.root / rig

    def _make(self, place: Path, mirror: Path, commit: str) -> None:
        """``work/`` made afresh at ``commit`` by root and handed to the gate user: once per rig, or every probe of a
        pristine rig (the whole tree written)."""
        temp = place / ".work.tmp"
        git.force_remove(temp)
        git.git("init", "--quiet", str(temp))
        (temp / ".git" / "objects" / "info" / "alternates").write_text(f"{(mirror / 'objects').resolve()}\n")
        git.git("checkout", "--quiet", "--detach", commit, cwd=temp, timeout=CHECKOUT_TIMEOUT_S)
        self.user.hand_over(temp)
        git.force_remove(place / "work")
        if (place / "work").exists() or (place / "work").is_symlink():
            raise git.GitError(["workspace", str(place / "work")], 1, "the gate workspace could not be removed")
        temp.rename(place / "work")

    def _move(self, place: Path, mirror: Path, commit: str, trusted: bytes) -> None:
        """``work/`` moved to ``commit`` by the gate user's git, after root made its repository anew with the index
        root's last checkout wrote."""
        work = place / "work"
        owner = (self.user.uid, self.user.gid) if self.user.switch else None
        repository_renewal.renew(work, scratch=place, alternates=mirror / "objects", trusted_index=trusted, owner=owner)
        git.checkout_clean(work, ("--detach", commit), "-ffd")


def _mirror(bare: Path, mirror: Path, commit: str) -> None:
    """``commit`` and its history in root's mirror (readable by the gate user: ``--shared=0644``), under one ref."""
    if not (mirror / "HEAD").is_file():
        git.force_remove(mirror)
        git.git("init", "--quiet", "--bare", "--shared=0644", str(mirror))
    receive = f"--receive-pack={git.LOCAL_RECEIVE_PACK}"
    git.git("push", "--quiet", "--force", receive, "--", str(mirror), f"{commit}:refs/gate/tip", cwd=bare)
