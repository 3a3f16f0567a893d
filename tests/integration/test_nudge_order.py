"""Nudges to one pane are typed one at a time: each text and its Enter as one unit (the trial's two mail
announcements of the same second arrived as one line)."""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from services.witness.settings import WitnessSettings
from shared.core.config import TownConfig
from tests.helpers import assert_eventually
from tests.witness_town import PolecatTown, polecat_town

NUDGES = 12


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    settings = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0)
    async with polecat_town(town, nc, tmp_path, settings) as handle:
        yield handle


async def test_many_nudges_at_once_to_one_pane_arrive_as_separate_lines_each_intact(
    pt: PolecatTown, tmp_path: Path
) -> None:
    heard = tmp_path / "heard.txt"
    # An agent that records each line it reads from its terminal, as it got it.
    agent = f'while IFS= read -r line; do printf "%s\\n" "$line" >> {shlex.quote(str(heard))}; done'
    await pt.add_rig(agent_command=agent)
    bead = await pt.new_bead("Listen")
    await pt.sling(bead)

    def started() -> str:
        sessions = pt.sessions_of(bead)
        assert sessions, "no session yet"
        assert sessions[0].status == "started", sessions[0].status
        return sessions[0].id

    await assert_eventually(started, timeout=60)
    messages = [f"nudge number {i} says {'word ' * (i % 4)}end-{i}" for i in range(NUDGES)]
    queued = await asyncio.gather(*(pt.ok("gt.cmd.nudge.send", target="demo/ace", message=m) for m in messages))
    assert pt.witness is not None
    nudges = pt.witness.state.nudges
    # (Typed into the pane's terminal: a line read is what was typed between two Enters.)

    def delivered() -> bool:
        statuses = [getattr(nudges.get(q["id"]), "status", None) for q in queued]
        assert statuses == ["delivered"] * NUDGES, statuses
        return True

    await assert_eventually(delivered, timeout=120)
    await assert_eventually(lambda: heard.exists() and len(heard.read_text().splitlines()) >= NUDGES, timeout=30)
    lines = heard.read_text().splitlines()
    assert sorted(lines) == sorted(messages), lines
