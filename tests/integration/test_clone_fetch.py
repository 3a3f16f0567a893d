"""A rig's clone is fetched off the start path (``services/witness/effects/clone_fetch.py``), with real git, tmux and
panes: a released workspace's clean-up fetches it, so the polecat's next start runs no fetch; a bead slung right
after a merge still starts from the merged base (the merge is an event: the start fetches first); and a push made
outside the merge queue reaches new branches once the last fetch is older than ``FETCH_REUSE_S``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from services.witness.effects import clone_fetch
from shared.core.config import TownConfig
from shared.host import git
from shared.model.commands import BeadClose
from tests.helpers import assert_eventually
from tests.integration.test_workspace_recycle import HONEST, merged, next_bead_started
from tests.witness_town import IDENTITY, PolecatTown, polecat_town


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path, git_calls: Path) -> AsyncIterator[PolecatTown]:
    async with polecat_town(town, nc, tmp_path) as handle:
        yield handle


def first_works_then_hang(marker: Path) -> str:
    """The rig's first session commits ONE.txt and hands it in; every later one waits (the test reads its
    workspace, then closes its bead)."""
    return f"if mkdir {marker} 2>/dev/null; then {HONEST}; else GT_AGENT_FAULT=hang exec gt-agent; fi"


async def closed_and_settled(pt: PolecatTown, bead: str) -> None:
    """Close ``bead`` (its session waits), until its workspace is released and settled for the next one."""
    [session] = pt.sessions_of(bead)
    await pt.send(BeadClose(id=bead, reason="looked at"))
    await pt.wait_settled(bead, timeout=120)
    record = Path(session.worktree).parent.parent / "workspaces" / f"{session.polecat}.settled"
    await assert_eventually(record.exists, timeout=60, message="the released workspace settled")


def pushed_to_main(origin: Path, clone: Path) -> str:
    """An operator's commit of TWO.txt pushed straight to origin's main; its id."""
    git.git("clone", "--quiet", "--branch", "main", str(origin), str(clone))
    (clone / "TWO.txt").write_text("two\n")
    git.git("add", "TWO.txt", cwd=clone)
    git.git(*IDENTITY, "commit", "--quiet", "-m", "two, by hand", cwd=clone)
    git.git("push", "--quiet", "origin", "HEAD:refs/heads/main", cwd=clone)
    return git.git("rev-parse", "HEAD", cwd=clone).strip()


def fetches(calls: Path) -> int:
    return calls.read_text().splitlines().count("fetch --quiet")


async def test_the_clone_is_fetched_off_the_start_path_yet_new_branches_start_from_every_merge(
    pt: PolecatTown,
    tmp_path: Path,
    git_calls: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await pt.add_rig(agent_command=first_works_then_hang(tmp_path / "first-ran"), max_polecats=1)
    first = await pt.new_bead("One")
    await pt.sling(first)
    await merged(pt, first)
    await pt.wait_settled(first, timeout=120)  # its polecat's name free again: the next bead is slung to it

    # Slung right after the merge: whatever the release fetched before it, the merge is newer.
    second = await next_bead_started(pt)
    assert (Path(second.worktree) / "ONE.txt").read_text() == "one\n", "the new branch starts from the merge"

    # The release fetches (unless one began a moment before: no moment counts here), and the next start, well within
    # the window, does not.
    monkeypatch.setattr(clone_fetch, "RELEASE_REFETCH_S", 0.0)
    git_calls.write_text("")
    await closed_and_settled(pt, second.bead)
    assert fetches(git_calls) == 1, f"the release fetched: {git_calls.read_text()}"
    git_calls.write_text("")  # from here on: the next start's git only
    third = await next_bead_started(pt)
    assert third.worktree == second.worktree, "the polecat's settled workspace"
    assert fetches(git_calls) == 0, f"the start waited for no fetch: {git_calls.read_text()}"
    assert git.workspace_branch(Path(third.worktree)) == third.branch

    # A push to the base outside the merge queue (an operator's): no event tells of it; time does.
    monkeypatch.setattr(clone_fetch, "FETCH_REUSE_S", 0.0)
    pushed = pushed_to_main(pt.origin, tmp_path / "operator")
    await closed_and_settled(pt, third.bead)
    fourth = await next_bead_started(pt)
    assert git.git("rev-parse", "HEAD", cwd=Path(fourth.worktree)).strip() == pushed
    assert (Path(fourth.worktree) / "TWO.txt").read_text() == "two\n"
