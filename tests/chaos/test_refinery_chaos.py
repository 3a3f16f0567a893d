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
from shared.core.config import TownConfig
from shared.host import git, processes
from shared.model.events import decode_envelope
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


async def test_refinery_killed_mid_gate_leaves_no_gate_running_and_resumes_the_request_it_held(
    chaos_town: PolecatTown, gt_env: dict[str, str], tmp_path: Path
) -> None:
    """The trial's case: `kill -9` of the refinery while a long gate runs. The old gate (and what it started) is
    stopped, so the evidence it would write after its delay never appears; the restarted refinery takes the
    request its predecessor held before the other queued one, and each merges once."""
    pt = chaos_town
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    # Each run records its shell and the child that would write the evidence after a delay.
    gate = (
        f'echo $$ > "{evidence}/started-$$"; (sleep 4; touch "{evidence}/done-$$") & '
        f'echo $! > "{evidence}/child-$$"; wait'
    )
    refinery = ServiceProcess("refinery", refinery_env(pt, gt_env, "", tmp_path / "unused"), tmp_path / "ref.log")
    refinery.start()
    try:
        await pt.add_rig(test_command=gate)
        ids, beads = [], []
        for n in (1, 2):
            bead = await pt.new_bead(f"Change {n}", prefix="demo")
            head = pt.push_branch(f"polecat/p{n}/{bead}", {f"work-{n}.txt": f"change {n}\n"})
            beads.append(bead)
            ids.append(await pt.submit(bead, f"polecat/p{n}/{bead}", head))

        def first_gate() -> tuple[int, processes.ProcessRef, processes.ProcessRef]:
            started = sorted(evidence.glob("started-*"))
            assert started, "no gate started yet"
            pid = int(started[0].name.removeprefix("started-"))
            child_file = evidence / f"child-{pid}"
            assert child_file.exists(), "the gate's child is not recorded yet"
            assert child_file.read_text().strip(), "the gate's child is not recorded yet"
            shell, child = processes.ref_of(pid), processes.ref_of(int(child_file.read_text()))
            assert shell is not None, "the gate ended before it was seen"
            assert child is not None, "the gate ended before it was seen"
            return pid, shell, child

        pid, shell, child = await assert_eventually(first_gate, timeout=120, interval=0.05)
        held = (await replayed(pt.nc)).mrs
        assert held[ids[0]].status == "claimed"
        assert held[ids[1]].status == "queued"
        refinery.kill()
        refinery.start()

        async def merged() -> RefineryState:
            state = await replayed(pt.nc)
            assert [state.mrs[i].status for i in ids] == ["merged", "merged"]
            return state

        state: RefineryState = await assert_eventually(merged, timeout=120, interval=0.3)
        assert all(state.mrs[i].status == "merged" for i in ids)
        await assert_eventually(
            lambda: not processes.is_alive(shell) and not processes.is_alive(child), message="the old gate still runs"
        )
        assert not (evidence / f"done-{pid}").exists(), "the killed refinery's gate ran on to its end"
        work = pt.config.gt_home / "rigs" / "demo" / "refinery" / "work"
        assert processes.working_in(work) == [], "a process still runs in the refinery's worktrees"
        events = [decode_envelope(data) for _s, _subj, data in await read_all(pt.nc, "GT_EVT", "gt.evt.mr.>")]
        claims = [msgspec.json.decode(env.data) for env in events if env.type == "mr.claimed"]
        first_holder = claims[0]["holder"]
        after = [claim["mr_id"] for claim in claims if claim["holder"] != first_holder]
        assert after[0] == ids[0], f"the restarted refinery took {after[0]} before the request its predecessor held"
        merges = [msgspec.json.decode(env.data)["mr_id"] for env in events if env.type == "mr.merged"]
        assert sorted(merges) == sorted(ids), "each request merged once"
        subjects = git.git("log", "--format=%s", "refs/heads/main", cwd=pt.origin).splitlines()
        for n in (1, 2):
            assert len([s for s in subjects if s.endswith(f"work-{n}.txt")]) == 1, "each change landed once"
        gates = pt.config.gt_home / "rigs" / "demo" / "refinery" / "gates"
        assert not list(gates.glob("*.json")), "a gate's record was left behind"
        assert refinery.returncode() is None, refinery.log_text()
    finally:
        refinery.stop()
