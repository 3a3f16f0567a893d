"""When each rig's clone last fetched its origin, and whether a new branch may start from the base as it has it.

A new branch starts from the base as the rig's clone has it (the merge queue rebases anyway). The clone is
fetched again before one does when it could lack work: a merge its merge queue pushed after the last fetch began
(``mr.merged``, in the witness's state as ``base_merged``), or pushes made outside the queue, seen within
``FETCH_REUSE_S``. A workspace's release fetches it too (``cleanup``), so the polecat's next start, and every start
while the town is busy, finds it fresh and waits for no fetch.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple

from shared.host import git

FETCH_REUSE_S = 30.0
"""How long a fetch of a rig's clone serves new branches when its merge queue merged nothing since: a push to the
base outside the queue reaches new branches within this (the queue's own merges at once)."""
RELEASE_REFETCH_S = 2.0
"""A release fetches unless a fetch began this recently (many sessions ending at once: one fetch), so the next
start, up to ``FETCH_REUSE_S`` later, finds the clone fresh."""


class Fetched(NamedTuple):
    began: float
    """When (``time.monotonic``) the fetch began: what origin had then is in the clone."""
    merged: int
    """The rig's newest merge known when it began (``WitnessState.base_merged``; 0: none): in the clone too."""


def fresh(last: Fetched | None, merged: int, wanted: float, reuse_s: float | None = None) -> bool:
    """Whether a clone last fetched as ``last`` serves a branch asked for at ``wanted`` (monotonic), the rig's newest
    merge being ``merged``: nothing merged since the fetch began, and it began at most ``reuse_s`` before
    (``FETCH_REUSE_S`` by default)."""
    reuse_s = FETCH_REUSE_S if reuse_s is None else reuse_s
    return last is not None and last.merged >= merged and last.began >= wanted - reuse_s


class CloneFetches:
    """The last fetch of each rig's clone by this witness (a restarted witness fetches once before its first new
    branch). The caller holds the rig's repository lock (``Toolkit.repo_locks``) around a fetch."""

    def __init__(self) -> None:
        self._last: dict[str, Fetched] = {}

    def fresh(self, rig: str, merged: int, wanted: float, reuse_s: float | None = None) -> bool:
        return fresh(self._last.get(rig), merged, wanted, reuse_s)

    def record(self, rig: str, fetched: Fetched) -> None:
        """``fetched`` happened (a clone made counts: it began with a fetch)."""
        if fetched.began >= self._last.get(rig, fetched).began:
            self._last[rig] = fetched

    def fetch(self, rig: str, bare: Path, merged: int) -> None:
        """Fetch ``bare`` (``rig``'s clone) from its origin, ``merged`` being the rig's newest merge now.

        Raises:
            GitError: git failed (nothing recorded: the next start fetches).
        """
        began = time.monotonic()
        git.fetch(bare)
        self.record(rig, Fetched(began=began, merged=merged))
