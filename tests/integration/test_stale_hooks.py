"""Stale hooks with real parts: a working bead whose hook lease lapsed, that nobody took and that waits for no
merge, is handed by the deacon to the witness, which re-slings it (clean worktree) or escalates it (a rejected
merge request, dirty work, or stale again after a re-sling). Never dropped, never handed over twice."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from services.deacon.service import DeaconService
from services.deacon.settings import DeaconSettings
from services.refinery.service import RefineryService
from services.refinery.settings import RefinerySettings
from shared.core.config import TownConfig
from shared.host import git
from tests.helpers import assert_eventually
from tests.log_tools import events_of, outcomes
from tests.witness_town import FAST, PolecatTown, polecat_town

WATCH = DeaconSettings(
    stale_after_s=5.0, startup_grace_s=60.0, escalate_after_s=600.0, watched=(), tick_s=0.1, stale_hook_after_s=1.0
)


async def start_deacon(pt: PolecatTown) -> DeaconService:
    pt.deacon = DeaconService(pt.config, FAST, deacon=WATCH)
    await pt.start("deacon", pt.deacon)
    return pt.deacon


async def recoveries(pt: PolecatTown, bead: str) -> list[dict[str, Any]]:
    found = []
    for session in pt.sessions_of(bead):
        for kind, data in await events_of(pt.nc, f"gt.evt.session.{session.id}"):
            if kind == "session.hook_recovered":
                found.append(data)
    return found


async def handovers(pt: PolecatTown, bead: str) -> list[str]:
    """Outcomes (accepted or rejected) of the deacon's stale-hook commands for the bead."""
    return sorted(cmd for cmd in await outcomes(pt.nc) if cmd.startswith(f"stale-hook-{bead}-"))


@pytest.fixture
async def no_refinery(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    async with polecat_town(town, nc, tmp_path, with_refinery=False) as handle:
        await start_deacon(handle)
        yield handle


async def test_a_stale_hook_is_reslung_once_then_escalated_and_the_work_lands_once(no_refinery: PolecatTown) -> None:
    """No refinery runs (and none is watched): `gt done`'s merge requests wait in GT_CMD, the hook is free and
    nothing moves the bead. The deacon hands it over; the witness re-slings it (the worktree was removed clean);
    when it goes stale again it is escalated. Once a refinery runs, the work lands once and the bead closes once."""
    pt = no_refinery
    await pt.add_rig(agent_command="gt-agent")
    bead = await pt.new_bead("Nobody merges me", prefix="demo")
    await pt.sling(bead)

    async def escalated() -> list[dict[str, Any]]:
        found = await recoveries(pt, bead)
        assert [r["resolution"] for r in found] == ["resling", "escalate"], found
        return found

    found: list[dict[str, Any]] = await assert_eventually(escalated, timeout=120, interval=0.2)
    assert [r["token"] for r in found] == [1, 2], "one hand-over per lapsed token"
    sessions = pt.sessions_of(bead)
    assert [s.end_reason for s in sessions] == ["done", "done"]
    # The escalation is the witness's next action after it recorded the decision.
    await assert_eventually(lambda: pt.sessions_of(bead)[-1].escalated == "stale_hook", timeout=30)
    assert pt.mayor is not None
    mayor = pt.mayor
    assert mayor.projection.state.beads[bead].slings == 2, "the operator's sling and the witness's re-sling"
    await assert_eventually(
        lambda: [
            e for e in mayor.projection.state.escalations.values() if e.bead == bead and "stale again" in e.message
        ]
    )
    assert mayor.projection.state.beads[bead].status == "in_progress", "still hooked: waiting for a person"
    assert await handovers(pt, bead) == [f"stale-hook-{bead}-1", f"stale-hook-{bead}-2"]

    pt.refinery = RefineryService(pt.config, FAST)
    await pt.start("refinery", pt.refinery)
    await assert_eventually(lambda: mayor.projection.state.beads[bead].status == "closed", timeout=120)
    closes = [kind for kind, _ in await events_of(pt.nc, f"gt.evt.bead.{bead}") if kind == "bead.closed"]
    assert closes == ["bead.closed"]
    subjects = git.git("log", "--format=%s", "refs/heads/main", cwd=pt.origin).splitlines()
    assert sum(1 for s in subjects if s.startswith(f"{bead}:")) == len(pt.branch_files(sessions[0].branch, bead))
    assert len(await handovers(pt, bead)) == 2, "a closed bead is never handed over"


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    # Batches of two with a long wait: a lone merge request stays queued until the test rejects it.
    waiting = RefinerySettings(batch=2, batch_wait_s=600)
    async with polecat_town(town, nc, tmp_path, refinery=waiting) as handle:
        await start_deacon(handle)
        yield handle


async def test_a_bead_whose_merge_request_was_rejected_is_escalated_not_reslung(pt: PolecatTown) -> None:
    await pt.add_rig(agent_command="gt-agent")
    bead = await pt.new_bead("Rejected by an operator", prefix="demo")
    await pt.sling(bead)
    submitted = await pt.wait_merge_requested(bead)
    mr_id = str(submitted["id"])
    await pt.wait_settled(bead)
    rejected = await pt.ok("gt.cmd.mr.reject", id=mr_id, reason="not wanted")
    assert rejected["status"] == "rejected"

    async def escalated() -> dict[str, Any]:
        found = await recoveries(pt, bead)
        assert [r["resolution"] for r in found] == ["escalate"], found
        return found[0]

    recovery: dict[str, Any] = await assert_eventually(escalated, timeout=60, interval=0.2)
    assert "merge request was rejected" in recovery["detail"]
    assert pt.mayor is not None
    mayor = pt.mayor
    await assert_eventually(
        lambda: [e for e in mayor.projection.state.escalations.values() if e.bead == bead and "rejected" in e.message]
    )
    assert len(pt.sessions_of(bead)) == 1, "not re-slung: an operator decides"
    assert mayor.projection.state.beads[bead].status == "in_progress"
    assert await handovers(pt, bead) == [f"stale-hook-{bead}-1"]
