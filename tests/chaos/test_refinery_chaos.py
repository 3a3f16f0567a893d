"""Chaos: kill -9 the refinery inside each crash window of the merge (rebase, gates, after the push, after the
bead close) and start it again: the target gets the change exactly once, the bead closes once, and no
temporary worktree is left."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client

from services.refinery.projection import new_projection
from services.refinery.state import RefineryState
from shared import git
from shared.config import TownConfig
from shared.events import decode_envelope
from tests.chaos.test_witness_chaos import wait_for_crash
from tests.helpers import assert_eventually
from tests.log_tools import fresh_replay, read_all
from tests.service_process import ServiceProcess
from tests.witness_town import PolecatTown, polecat_town

pytestmark = pytest.mark.chaos


@pytest.fixture
async def chaos_town(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    async with polecat_town(town, nc, tmp_path, with_refinery=False) as handle:
        yield handle


def refinery_env(pt: PolecatTown, gt_env: dict[str, str], crash_at: str, marker: Path, **extra: str) -> dict[str, str]:
    """A refinery process crashing once at ``crash_at``, with a short lease so its claims are taken again soon."""
    return {
        **gt_env,
        "NATS_URL": pt.config.nats_url,
        "GT_HOME": str(pt.config.gt_home),
        "GT_MQ_LEASE": "2",
        "GT_CRASH_AT": crash_at,
        "GT_CRASH_MARKER": str(marker),
        **extra,
    }


async def replayed(nc: Client) -> RefineryState:
    state: RefineryState = (await fresh_replay(nc, new_projection())).state
    return state


@pytest.mark.parametrize(
    "crash_at",
    ["refinery.after_rebase", "refinery.during_gates", "refinery.after_push", "refinery.after_bead_close"],
)
async def test_refinery_killed_mid_merge_converges_without_merging_twice(
    chaos_town: PolecatTown, gt_env: dict[str, str], tmp_path: Path, crash_at: str
) -> None:
    pt = chaos_town
    marker = tmp_path / "crashed"
    refinery = ServiceProcess("refinery", refinery_env(pt, gt_env, crash_at, marker), tmp_path / "refinery.log")
    refinery.start()
    try:
        await pt.add_rig(lint_command="true")
        bead = await pt.new_bead("Merge me through a crash")
        await pt.sling(bead)
        await wait_for_crash(refinery, marker, timeout=120)
        refinery.start()

        async def merged() -> RefineryState:
            state = await replayed(pt.nc)
            mrs = [m for m in state.mrs.values() if m.bead == bead]
            assert [m.status for m in mrs] == ["merged"], [(m.id, m.status) for m in mrs]
            assert state.beads[bead].status == "closed"
            return state

        state: RefineryState = await assert_eventually(merged, timeout=120, interval=0.3)
        closes = [
            decode_envelope(data)
            for _s, _subj, data in await read_all(pt.nc, "GT_EVT", f"gt.evt.bead.{bead}")
            if decode_envelope(data).type == "bead.closed"
        ]
        assert len(closes) == 1, "the bead closed once"
        mr = next(m for m in state.mrs.values() if m.bead == bead)
        # After the push, the second attempt finds the change on the target: "merged in <mr>: its work was
        # already on main".
        assert msgspec.json.decode(closes[0].data)["reason"].startswith(f"merged in {mr.id}")
        subjects = git.git("log", "--format=%s", "refs/heads/main", cwd=pt.origin).splitlines()
        assert subjects.count(f"{bead}: submit") == 1, "the change is on the target exactly once"
        assert subjects.count(f"{bead}: load-context") == 1
        work = pt.config.gt_home / "rigs" / "demo" / "refinery" / "work"
        await assert_eventually(lambda: not work.exists() or not any(work.iterdir()), message="temp worktrees left")
        assert refinery.returncode() is None, refinery.log_text()
    finally:
        refinery.stop()


@pytest.mark.parametrize("crash_at", ["refinery.during_gates", "refinery.after_push"])
async def test_refinery_killed_mid_batch_lands_each_change_once_and_blames_only_the_culprit(
    chaos_town: PolecatTown, gt_env: dict[str, str], tmp_path: Path, crash_at: str
) -> None:
    pt = chaos_town
    marker = tmp_path / "crashed"
    env = refinery_env(pt, gt_env, crash_at, marker, GT_MQ_LEASE="1", GT_MQ_BATCH="4", GT_MQ_BATCH_WAIT="60")
    refinery = ServiceProcess("refinery", env, tmp_path / "refinery.log")
    refinery.start()
    try:
        await pt.add_rig()
        beads, ids = [], []
        for n in range(1, 5):
            bead = await pt.new_bead(f"Batch change {n}", prefix="demo")
            files = {f"work-{n}.txt": f"change {n}\n", **({"FAIL_TESTS": "red\n"} if n == 2 else {})}
            head = pt.push_branch(f"polecat/p{n}/{bead}", files)
            beads.append(bead)
            ids.append(await pt.submit(bead, f"polecat/p{n}/{bead}", head))
        await wait_for_crash(refinery, marker, timeout=120)
        refinery.start()

        async def settled() -> RefineryState:
            state = await replayed(pt.nc)
            assert [state.mrs[i].status for i in ids] == ["merged", "failed", "merged", "merged"]
            assert all(state.beads[beads[n]].status == "closed" for n in (0, 2, 3))
            return state

        state: RefineryState = await assert_eventually(settled, timeout=120, interval=0.3)
        assert state.beads[beads[1]].status != "closed"
        for n in (0, 2, 3):
            closes = [
                data
                for _s, _subj, data in await read_all(pt.nc, "GT_EVT", f"gt.evt.bead.{beads[n]}")
                if decode_envelope(data).type == "bead.closed"
            ]
            assert len(closes) == 1, "each bead closed once"
        subjects = git.git("log", "--format=%s", "refs/heads/main", cwd=pt.origin).splitlines()
        for n in (1, 3, 4):
            assert len([s for s in subjects if s.endswith(f"work-{n}.txt")]) == 1, "each change landed once"
        assert not [s for s in subjects if "FAIL_TESTS" in s]
        work = pt.config.gt_home / "rigs" / "demo" / "refinery" / "work"
        await assert_eventually(lambda: not work.exists() or not any(work.iterdir()), message="temp worktrees left")
        assert refinery.returncode() is None, refinery.log_text()
    finally:
        refinery.stop()
