"""Notice an agent's death the moment it happens: a pidfd per watched process, readable when it exits.

The patrol finds every death anyway; this only makes recovery start at once instead of on the next tick.
Linux-only (``os.pidfd_open``); elsewhere it watches nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
from collections.abc import Callable

import structlog

from shared.host import processes

log = structlog.get_logger(__name__)


class ExitWatcher:
    """Calls ``on_exit()`` (on the event loop) when a watched process exits."""

    def __init__(self, on_exit: Callable[[], None]) -> None:
        self._on_exit = on_exit
        self._fds: dict[str, int] = {}
        self._refs: dict[str, processes.ProcessRef] = {}
        self.supported = hasattr(os, "pidfd_open")

    def watch(self, key: str, ref: processes.ProcessRef) -> None:
        """Watch the process ``ref`` names under ``key`` (again: nothing changes)."""
        if not self.supported or key in self._fds:
            return
        try:
            fd = os.pidfd_open(ref.pid)
        except (ProcessLookupError, OSError):
            self._on_exit()
            return
        # The pidfd names whatever has the pid now: it is ours only if that process is the one recorded.
        if not processes.is_alive(ref):
            os.close(fd)
            self._on_exit()
            return
        self._fds[key], self._refs[key] = fd, ref
        asyncio.get_running_loop().add_reader(fd, self._fired, key)

    def running(self, refs: dict[str, processes.ProcessRef]) -> set[str]:
        """Of ``refs``, those watched (as that very process) whose pidfd says it runs now: one ``poll`` for all
        of them, where a /proc look costs three reads each (the patrol asks about every agent, every time)."""
        watched = {key: fd for key, fd in self._fds.items() if refs.get(key) == self._refs[key]}
        if not watched:
            return set()
        poller = select.poll()
        for fd in watched.values():
            poller.register(fd, select.POLLIN)
        exited = {fd for fd, _ in poller.poll(0)}  # a pidfd is readable once its process has exited
        return {key for key, fd in watched.items() if fd not in exited}

    def _fired(self, key: str) -> None:
        self._forget(key)
        self._on_exit()

    def _forget(self, key: str) -> None:
        fd = self._fds.pop(key, None)
        self._refs.pop(key, None)
        if fd is None:
            return
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(fd)
        with contextlib.suppress(OSError):
            os.close(fd)

    def keep_only(self, keys: set[str]) -> None:
        """Stop watching everything not in ``keys`` (sessions that ended)."""
        for key in [k for k in self._fds if k not in keys]:
            self._forget(key)

    def close(self) -> None:
        self.keep_only(set())

    def __len__(self) -> int:
        return len(self._fds)
