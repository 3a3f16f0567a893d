"""One thread at a time per path in this process: what a repository or a workspace shared by a service's worker
threads needs (git trips over its own lock files when two of its processes change one repository)."""

from __future__ import annotations

import threading
from pathlib import Path

_LOCKS: dict[Path, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def lock(path: Path) -> threading.Lock:
    """The lock of ``path`` (the same one for every caller asking for that path)."""
    with _LOCKS_LOCK:
        return _LOCKS.setdefault(path, threading.Lock())
