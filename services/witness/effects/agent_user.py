"""Agents as another OS user (``GT_AGENT_USER``): the way out of "an agent is the town's own user".

An agent the witness starts as its own user can do whatever that user can: read the town's secrets in GT_HOME,
write the rig's clone and repository, signal the services, drive every pane on the tmux server. With
``GT_AGENT_USER`` the witness (root) starts each agent as that user instead (``argv_prefix``), and hands it only
what a session needs (``hand_over_session``): its workspace, its password file, its runtime dir (a config home,
hook marks, ``HOME``) and the folder `gt done` publishes into. The paths down to them are opened for traversal
only (``S_IXOTH``: nothing listed), the rig's clone's objects for reading (the workspace borrows them through
git's alternates); GT_HOME's secrets, the town's data, the clones' refs and config stay root's. Every git the
witness runs in a workspace runs as the agent's user (``shared/host/git.py``: a repository another user owns is
worked in as that user), so an agent's config or filters never run as root.

Agents of one town share the user: one session can read another's files (documented). Adapter: changes owners and
modes.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from shared.host import os_user, safe_files
from shared.host.os_user import OsUser


def resolve(name: str, *, euid: int | None = None) -> OsUser | None:
    """The agent user ``GT_AGENT_USER`` names (None when unset); ValueError when it cannot be used."""
    return os_user.resolve("GT_AGENT_USER", name, service="witness", what="agents", euid=euid)


def resolve_town_agents(name: str, agents: OsUser | None, *, euid: int | None = None) -> OsUser | None:
    """The user ``GT_TOWN_AGENT_USER`` names (None when unset); ValueError when it cannot be used, or is the
    polecats' (``agents``): one of them could then read the mayor agent's credential."""
    user = os_user.resolve("GT_TOWN_AGENT_USER", name, service="witness", what="the town agents", euid=euid)
    if user is not None and agents is not None and user.uid == agents.uid:
        raise ValueError(
            f"GT_TOWN_AGENT_USER={name}: that is GT_AGENT_USER's user; the mayor agent needs a user of its own "
            "(polecats could read its credential otherwise): create one (useradd --system mayor)"
        )
    return user


def check_reachable(user: OsUser | None, gt_home: Path) -> None:
    """Raise ValueError, saying what to do, when ``user`` could not pass through the directories that hold
    GT_HOME (the witness opens GT_HOME itself and what is under it, never what is above it: a home directory, say)."""
    if user is None or not user.switch:
        return
    for above in gt_home.resolve().parents:
        if not above.stat().st_mode & stat.S_IXOTH:
            raise ValueError(
                f"GT_AGENT_USER={user.name}: {user.name} cannot reach GT_HOME ({gt_home}): {above} is closed to "
                f"other users; put GT_HOME where they may pass (e.g. /var/lib/gastown) or `chmod o+x {above}`"
            )


def trust_repository(session_dir: Path, repository: Path, user: OsUser) -> None:
    """Name the rig's repository (a path on this machine, another user's) safe in the agent's own git
    configuration, in its ``HOME`` (``<session_dir>/home``): git refuses to fetch from a repository another user
    owns otherwise, and an agent fetches the newest base from it to rebase its work. Reading it is all the agent
    can do there. Written without following a link the agent may have put in its runtime dir."""
    lines = ("[safe]", f"\tdirectory = {repository}")
    safe_files.add_lines_beneath(session_dir, "home/.gitconfig", lines, owner=(user.uid, user.gid), as_block=True)


def open_for_traversal(paths: Iterable[Path]) -> None:
    """Let any user pass through each directory of ``paths`` (to what lies below it, by name) without listing it."""
    for path in paths:
        mode = path.stat().st_mode
        if not mode & stat.S_IXOTH:
            path.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def open_for_reading(top: Path) -> None:
    """Let any user read everything under ``top`` (the clone's objects an agent's workspace borrows); links are
    left alone."""
    for root, dirs, files in os.walk(top):
        for name in dirs:
            _add(Path(root) / name, stat.S_IROTH | stat.S_IXOTH)
        for name in files:
            _add(Path(root) / name, stat.S_IROTH)
    _add(top, stat.S_IROTH | stat.S_IXOTH)


def _add(path: Path, bits: int) -> None:
    found = path.lstat()
    if stat.S_ISLNK(found.st_mode) or found.st_mode & bits == bits:
        return
    path.chmod(stat.S_IMODE(found.st_mode) | bits)


def hand_over_session(user: OsUser, workspace: Path, owned: Iterable[Path], files: Iterable[Path]) -> None:
    """Give ``user`` the session's ``workspace`` (once: a workspace already its own is not walked again, it may be
    large), its small directories ``owned`` (made when missing, 0700; walked every time, the witness writes into
    them) and ``files`` (kept 0600)."""
    try:
        if workspace.stat().st_uid != user.uid:
            user.hand_over(workspace)
        for folder in owned:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            user.hand_over(folder)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise safe_files.UnsafeFileError(f"{exc.filename or 'a session directory'} is not a directory") from exc
        raise
    for file in files:
        os.chown(file, user.uid, user.gid, follow_symlinks=False)
