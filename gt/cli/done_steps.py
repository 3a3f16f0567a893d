"""The steps `gt done` sends, each with its fixed id, and why it refuses a workspace: shared by a polecat session's
`gt done` (``gt/cli/polecats.py``) and a crew member's (``gt/cli/crew.py``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from gt.cli import client, render
from gt.cli.common import DEFAULT_COMMAND_TIMEOUT_S, EXIT_OK, EXIT_REJECTED
from shared.core.config import TownConfig
from shared.core.errors import GastownError
from shared.host import git
from shared.model.commands import Command

if TYPE_CHECKING:
    from shared.bus.connection import Connection

R = TypeVar("R")


async def done_step(nc: Connection, config: TownConfig, cmd: Command[R]) -> R | None:
    """Send one step of `gt done` (with its fixed ``cmd_id``) and wait for its outcome: its result, or None when it
    is stored but not answered yet; raise with the reason when it is rejected."""
    outcome = await client.send(nc, config, cmd, timeout=DEFAULT_COMMAND_TIMEOUT_S * 3, wait_if_down=False)
    if (rejected := outcome.rejected) is not None:
        raise DoneError(f"{cmd.SUBJECT} rejected ({rejected.code}): {rejected.message}")
    if (accepted := outcome.accepted) is None:
        # Stored durably in GT_CMD: the owning service answers it when it is back; `gt done` goes on.
        return None
    return accepted.result


class DoneError(GastownError):
    """A step of `gt done` was rejected; `gt done` says which and why."""

    exit_code = EXIT_REJECTED


DIRTY_NAMED = 5
"""How many of the paths that hold `gt done` up its refusal names (the rest are counted)."""


def dirty_refusal(worktree: Path, changes: tuple[str, ...]) -> str:
    """Why `gt done` refuses a worktree with uncommitted changes: the paths (a few, then how many more) and the
    three ways out, so an agent (or a person) knows which files and what to do with them."""
    named = ", ".join(changes[:DIRTY_NAMED]) or "files git status shows"
    more = f" and {len(changes) - DIRTY_NAMED} more" if len(changes) > DIRTY_NAMED else ""
    return (
        f"gt done: the worktree {worktree} has uncommitted changes: {named}{more} (`git status` lists them). "
        "`gt done` submits commits only and leaves nothing behind: commit what is your work (`git add` and "
        "`git commit`), remove what is not, and add output of builds or tests to the project's .gitignore "
        "(committed with your work); then run `gt done` again"
    )


def failed(exc: DoneError | git.GitError, branch: str) -> int:
    """What `gt done` says when a step was refused or the branch could not be published; its exit status."""
    why = str(exc) if isinstance(exc, DoneError) else f"could not publish {branch}: {exc}"
    print(f"gt done: {why}", file=sys.stderr)
    return EXIT_REJECTED


def reported(as_json: bool, summary: dict[str, str | None], line: str) -> int:
    """`gt done`'s answer once its merge request is sent: ``summary`` with ``--json``, else ``line`` (``{queued}``
    filled in with the merge request, or that it waits for the refinery)."""
    if as_json:
        render.print_json(summary)
    else:
        mr = summary.get("merge_request")
        print(line.format(queued=f"merge request {mr}" if mr else "merge request (stored; the refinery is down)"))
    return EXIT_OK
