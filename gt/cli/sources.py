"""Whether the code a client helper imported has changed since (an upgrade, an edit): its calls would otherwise
run the old code.

Asked before every call, so it must cost next to nothing: the directories holding the imported files are
watched with inotify, and a change shows as the watch's descriptor becoming readable. Nobody reads the events,
so once readable it stays readable, for the helper and for every worker forked from it (they share the
descriptor). Without inotify (another kernel, the user's watch limit reached) each call compares every file's
modification time instead, as before (186 files: 0.4 ms of a 15 ms call).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import sys

# <sys/inotify.h>: what changes a file or a directory's entries; never IN_ACCESS or IN_OPEN (reading a file).
IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
CHANGES = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)


def imported() -> dict[str, int]:
    """Modification times of the files this process imported from outside the standard library (which changes
    only with the interpreter, part of the helper's key), and of the site-packages directories they came from
    (a package installed or removed there)."""
    seen: dict[str, int] = {}
    stdlib = os.path.dirname(os.__file__)
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and ("site-packages" in path or not path.startswith(stdlib + os.sep)):
            with contextlib.suppress(OSError):
                seen[path] = os.stat(path).st_mtime_ns
    for directory in {p[: p.index("site-packages") + 13] for p in seen if "site-packages" in p}:
        with contextlib.suppress(OSError):
            seen[directory] = os.stat(directory).st_mtime_ns
    return seen


def changed_since(sources: dict[str, int]) -> bool:
    """Whether any of ``sources`` (``imported()``'s answer) has another modification time now, or is gone."""
    for path, mtime in sources.items():
        try:
            if os.stat(path).st_mtime_ns != mtime:
                return True
        except OSError:
            return True
    return False


class SourceWatch:
    """The imported code as it was when made; ``changed()`` says whether it still is."""

    def __init__(self, sources: dict[str, int] | None = None) -> None:
        """``sources``: files (and directories) with their modification times; those ``imported()`` by default."""
        self._sources = imported() if sources is None else sources
        self._fd = _watch({os.path.dirname(p) if os.path.isfile(p) else p for p in self._sources})
        # A change between the imports and the watch is seen by the watch's own first look.
        self._changed_before = self._fd is not None and changed_since(self._sources)

    @property
    def watching(self) -> bool:
        """Whether inotify watches (else every ``changed()`` compares modification times)."""
        return self._fd is not None

    def changed(self) -> bool:
        if self._fd is None:
            return changed_since(self._sources)
        if self._changed_before:
            return True
        readable, _, _ = select.select([self._fd], [], [], 0)
        return bool(readable)


def _watch(directories: set[str]) -> int | None:
    """An inotify descriptor watching ``directories`` for changes; None when inotify cannot watch them all."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
    except (OSError, AttributeError):
        return None
    if fd < 0:
        return None
    for directory in sorted(directories):
        if libc.inotify_add_watch(fd, os.fsencode(directory), CHANGES) < 0:
            os.close(fd)
            return None
    return fd
