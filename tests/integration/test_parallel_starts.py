"""Sessions of one rig start together: what touches the rig's clone as a whole is done one git process at a time
(git's own files would trip otherwise), a fetch serves every start that asked within a moment of it, and nothing
else of a start waits for another's."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from shared.core.config import TownConfig
from shared.host import git
from tests.helpers import assert_eventually
from tests.witness_town import PolecatTown, polecat_town

BEADS = 12
HANG = "GT_AGENT_FAULT=hang gt-agent"


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path, git_calls: Path) -> AsyncIterator[PolecatTown]:
    async with polecat_town(town, nc, tmp_path, with_refinery=False) as handle:
        yield handle


async def test_beads_slung_at_once_to_one_rig_start_together_with_a_fetch_or_two(
    pt: PolecatTown, git_calls: Path
) -> None:
    await pt.add_rig(agent_command=HANG, max_polecats=BEADS)
    beads = [await pt.new_bead(f"bead {i}") for i in range(BEADS)]
    git_calls.write_text("")  # from here on: the starts' git only
    await asyncio.gather(*(pt.sling(bead) for bead in beads))

    def all_started() -> list[str]:
        sessions = [s for bead in beads for s in pt.sessions_of(bead)]
        assert [s.status for s in sessions] == ["started"] * BEADS, [(s.id, s.status) for s in sessions]
        return [s.worktree for s in sessions]

    worktrees = await assert_eventually(all_started, timeout=120, message="every bead's session started")
    assert pt.witness is not None
    assert pt.witness.action_errors == 0, "no start failed (git trips on its own files when adds overlap)"
    calls = Counter((await asyncio.to_thread(git_calls.read_text)).splitlines())
    # One workspace each (a repository of its own: `git init`), no worktree of the clone.
    assert calls["init --quiet"] == BEADS, calls
    assert calls["worktree add"] == 0, calls
    assert calls["worktree prune"] == 0, calls
    assert 1 <= calls["fetch --quiet"] < BEADS / 2, f"one fetch serves the starts that asked within moments: {calls}"
    for bead, worktree in zip(beads, worktrees, strict=True):
        branch = git.git("rev-parse", "--abbrev-ref", "HEAD", cwd=Path(worktree)).strip()
        assert branch.endswith(f"/{bead}"), (worktree, branch)
