"""Another OS user a root service starts untrusted code as: the refinery's gates (``GT_GATE_USER``) and the
witness's agents (``GT_AGENT_USER``). Resolved once at start-up; what it cannot be is refused there, naming the
setting. Adapter: reads the user database, changes owners.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Any

import msgspec

from shared.host import safe_files


class OsUser(msgspec.Struct, frozen=True, kw_only=True):
    """An unprivileged OS user a service runs code as."""

    name: str
    uid: int
    gid: int
    switch: bool
    """True when the service (root) must switch to this user; False when it already runs as it."""

    def process_options(self) -> dict[str, Any]:
        """``subprocess`` arguments that start a process as this user with only its own group."""
        if not self.switch:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def argv_prefix(self) -> tuple[str, ...]:
        """A command prefix that runs the rest as this user (its own group only, no way back to more rights through
        a set-user-id program); nothing when no switch is needed."""
        return switch_user_argv(self.uid, self.gid) if self.switch else ()

    def hand_over(self, top: Path) -> None:
        """Give this user ``top`` and everything under it. The tree may be an agent's and change meanwhile: walked
        through directory descriptors, no link followed, no hard link given away (``safe_files.chown_tree``)."""
        if self.switch:
            safe_files.chown_tree(top, self.uid, self.gid)


def switch_user_argv(uid: int, gid: int) -> tuple[str, ...]:
    """A command prefix (for root) that runs the rest as ``uid``:``gid``, its own group only, with no way back to
    more rights through a set-user-id program."""
    return ("setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs", "--")


def resolve(setting: str, name: str, *, service: str, what: str, euid: int | None = None) -> OsUser | None:
    """The user ``name`` (the value of ``setting``) the ``service`` starts ``what`` as; None when unset. Raises
    ValueError, naming the setting and what to do, when it cannot be used: no such user, root itself, or a
    service that is not root naming another user."""
    if not name:
        return None
    euid = os.geteuid() if euid is None else euid
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ValueError(
            f"{setting}={name}: no such user on this host; create it (useradd --system {name}) or unset {setting}"
        ) from None
    if entry.pw_uid == 0:
        raise ValueError(f"{setting}={name}: that is root; name an unprivileged user {what} may run as")
    if euid != 0 and entry.pw_uid != euid:
        try:
            me = pwd.getpwuid(euid).pw_name
        except KeyError:
            me = str(euid)
        raise ValueError(
            f"{setting}={name}: the {service} runs as {me}, not root, so it cannot start {what} as another "
            f"user; run the {service} as root (only its {what} then run as {name}) or unset {setting}"
        )
    return OsUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid, switch=entry.pw_uid != euid)
