"""git run ``in_background`` (the witness's look over a finished session's workspace) runs at a lower CPU priority,
it and everything it starts, in the thread or task that asked for it and nowhere else. Real git: an alias that
prints the niceness its shell runs at."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from shared.host import git

NICENESS = ("-c", "alias.niceness=!nice", "niceness")


def niceness(repo: Path) -> int:
    """The niceness a process git starts runs at."""
    return int(git.git(*NICENESS, cwd=repo).strip())


async def test_git_in_background_runs_niced_there_and_only_there(tmp_path: Path) -> None:
    git.git("init", "--quiet", str(tmp_path))
    base = os.nice(0)
    assert niceness(tmp_path) == base

    with git.in_background():
        assert niceness(tmp_path) == base + git.BACKGROUND_NICENESS
        # Carried into the thread asyncio.to_thread runs it in, as the witness runs its clean-up.
        assert await asyncio.to_thread(niceness, tmp_path) == base + git.BACKGROUND_NICENESS
    assert niceness(tmp_path) == base

    def released_in_background() -> int:
        with git.in_background():
            return niceness(tmp_path)

    # Set inside a worker thread: the pool's thread runs the next git at the normal priority.
    assert await asyncio.to_thread(released_in_background) == base + git.BACKGROUND_NICENESS
    assert await asyncio.to_thread(niceness, tmp_path) == base
    assert os.nice(0) == base, "the service itself keeps its priority"
