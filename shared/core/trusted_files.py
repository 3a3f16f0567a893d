"""Files whose contents the town runs as its own commands (automations, a formula's CI gate): trusted only when
nobody but the services' OS user or root could have written them."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def trust_problem(path: Path, what: str) -> str | None:
    """Why a service may not take ``path`` (``what``: the automations ``directory``, an automation ``file``, a
    formula file with a ``ci`` gate) for its operator's: None when it is fit to be read.

    What it holds runs as a command of the town's (an automation's, a CI gate's check), so (like sshd's StrictModes)
    only what the service's own OS user or root owns and neither group nor others may write: agents write the town's
    shared ``GT_HOME``, and a file one of them dropped there must not run. On a read-only mount (a read-only bind
    mount of the operator's directory in a container) the owner is not looked at, only the mode: nobody writes it
    through this mount, whoever owns it. Links are followed: what counts is what gets read."""
    try:
        info = os.stat(path)
        read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return None  # gone or unreadable: reading it says so (``AutomationCatalog._parse``)
    own = os.geteuid()
    if not read_only and info.st_uid not in (own, 0):
        return (
            f"refused: the {what} {path} is owned by uid {info.st_uid}, not by the town's services' user (uid {own}) "
            "or root: it may have been written by someone else (an agent)"
        )
    writable = [who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if info.st_mode & bit]
    if writable:
        return (
            f"refused: the {what} {path} is writable by {' and '.join(writable)} (mode "
            f"{stat.S_IMODE(info.st_mode):03o}): it may have been written by someone else (chmod go-w it)"
        )
    return None
