"""What the witness keeps of a polecat's workspace between its beads, in its own folder (``workspaces/``, 0700),
never in the workspace an agent writes: the index its own checkout wrote before the agent ran (the only index a
recycling trusts, ``repository_renewal``), and where a released workspace was settled (``git.settle_released``),
taken by the next start, which then moves it by the change alone. Adapter: files."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec

from services.witness.effects.toolkit import Toolkit
from services.witness.state import Session
from shared.host import git, repository_renewal

_settled_decoder = msgspec.json.Decoder(git.SettledWorkspace)


def recycle_of(kit: Toolkit, session: Session, *, settled: git.SettledWorkspace | None = None) -> git.Recycle:
    """How the session's released workspace is taken: with the index the witness's checkout wrote when it was last
    prepared (none kept: it is made again), its new repository the agent's when agents run as their own user."""
    store = kit.trusted_index(session)
    store.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        # The witness's own file, in a folder of its own: copied by the kernel as it renews the repository.
        trusted: Path | None = store if stat.S_ISREG(os.lstat(store).st_mode) else None
    except OSError:
        trusted = None
    owner = None
    user = kit.agent_user
    if user is not None and user.switch and os.lstat(session.worktree).st_uid == user.uid:
        owner = (user.uid, user.gid)
    return git.Recycle(trusted_index=trusted, scratch=store.parent, owner=owner, settled=settled)


def keep_trusted_index(kit: Toolkit, session: Session) -> None:
    """Keep the index the witness's checkout just wrote, before any agent ran in the workspace: the next bead's
    recycling trusts it, never the index the agent leaves (``repository_renewal``)."""
    store = kit.trusted_index(session)
    store.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temp = store.with_name(f".{store.name}.tmp")
    repository_renewal.keep_index(Path(session.worktree), temp)
    temp.replace(store)


@contextlib.asynccontextmanager
async def held(kit: Toolkit, session: Session) -> AsyncIterator[None]:
    """The session's workspace held against every other witness process of this GT_HOME (``flock`` on
    ``workspaces/<polecat>.lock``; the worktree lock keeps this process's own tasks apart): a witness deposed while it
    settles a workspace must not go on while its successor starts a session there."""
    lock = kit.trusted_index(session).with_suffix(".lock")
    fd = await asyncio.to_thread(_locked, lock)
    try:
        yield
    finally:
        os.close(fd)


def _locked(lock: Path) -> int:
    lock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def keep_prepared(kit: Toolkit, session: Session) -> None:
    """Record that the workspace was just prepared for ``session`` (before its agent ran): a start of the same session
    tried again after a crash must use it as it is, not recycle it under that agent's work."""
    mark = _prepared_mark(kit, session)
    temp = mark.with_name(f".{mark.name}.tmp")
    temp.write_text(session.id)
    temp.replace(mark)


def prepared_for(kit: Toolkit, session: Session) -> bool:
    """Whether the workspace was last prepared for ``session`` (``keep_prepared``)."""
    try:
        return _prepared_mark(kit, session).read_text() == session.id
    except FileNotFoundError:
        return False


def _prepared_mark(kit: Toolkit, session: Session) -> Path:
    return kit.trusted_index(session).with_suffix(".prepared")


def may_settle(kit: Toolkit) -> bool:
    """Whether released workspaces are settled when released: only where agents are the witness's own OS user,
    who could write in a workspace in use as well. Agents of an OS user of their own share that user, so one could
    write in another polecat's released workspace unseen by a move by the change: there the start takes the whole
    way, after the workspace was last written."""
    return kit.agent_user is None or not kit.agent_user.switch


def keep_settled(kit: Toolkit, session: Session, settled: git.SettledWorkspace) -> None:
    """Record where the session's released workspace was settled, for the next start to take."""
    mark = _settled_mark(kit, session)
    temp = mark.with_name(f".{mark.name}.tmp")
    temp.write_bytes(msgspec.json.encode(settled))
    temp.replace(mark)


def take_settled(kit: Toolkit, session: Session) -> git.SettledWorkspace | None:
    """Where the session's workspace was settled when released, if it was; the record goes with it: whatever
    happens to the workspace from here (a move by the change, a crash halfway), the next start takes the whole way
    unless a new settle records it again."""
    mark = _settled_mark(kit, session)
    try:
        data = mark.read_bytes()
    except FileNotFoundError:
        return None
    mark.unlink(missing_ok=True)
    try:
        return _settled_decoder.decode(data)
    except msgspec.DecodeError:
        return None


def forget_settled(kit: Toolkit, session: Session) -> None:
    _settled_mark(kit, session).unlink(missing_ok=True)


def _settled_mark(kit: Toolkit, session: Session) -> Path:
    return kit.trusted_index(session).with_suffix(".settled")
