"""Batch mode, a target that moves under a merge, and the machine-readable queue: real git, real gates.

Branches are pushed and submitted here the way `gt done` does it (no agents needed to show the queue's side).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from services.refinery.settings import RefinerySettings
from services.refinery.state import MergeRequest
from shared.core.config import TownConfig
from shared.host import git
from tests.helpers import assert_eventually
from tests.log_tools import events_of
from tests.witness_town import PolecatTown, polecat_town, run_gt

FAILS_ON_MARKERS = "! ls FAIL_* >/dev/null 2>&1"
"""The test gate: red while any FAIL_* file exists."""


@pytest.fixture
def batch() -> RefinerySettings:
    return RefinerySettings(batch=8, batch_wait_s=120)


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path, batch: RefinerySettings) -> AsyncIterator[PolecatTown]:
    async with polecat_town(town, nc, tmp_path, refinery=batch) as handle:
        yield handle


def mrs_of(pt: PolecatTown) -> dict[str, MergeRequest]:
    assert pt.refinery is not None
    return pt.refinery.projection.state.mrs


async def settled(pt: PolecatTown, ids: list[str], timeout: float = 120) -> dict[str, MergeRequest]:
    def done() -> dict[str, MergeRequest]:
        mrs = mrs_of(pt)
        pending = [
            (i, mrs[i].status if i in mrs else "not applied yet")
            for i in ids
            if i not in mrs or mrs[i].status not in ("merged", "failed")
        ]
        assert not pending, pending
        return {i: mrs[i] for i in ids}

    result: dict[str, MergeRequest] = await assert_eventually(done, timeout=timeout, interval=0.1)
    return result


async def mr_events(pt: PolecatTown, mr_id: str) -> list[tuple[str, dict[str, Any]]]:
    return await events_of(pt.nc, f"gt.evt.mr.{mr_id}")


def main_head(pt: PolecatTown) -> str:
    return git.git("rev-parse", "refs/heads/main", cwd=pt.origin).strip()


def main_tree(pt: PolecatTown) -> list[str]:
    return sorted(git.git("ls-tree", "--name-only", "refs/heads/main", cwd=pt.origin).split())


async def queue_branches(pt: PolecatTown, count: int, failing: set[int]) -> tuple[list[str], list[str]]:
    """``count`` beads, each with a branch adding its own file (and a FAIL_<n> marker if failing); (beads, mrs)."""
    beads, mrs = [], []
    for n in range(1, count + 1):
        bead = await pt.new_bead(f"Change {n}", prefix="demo")
        files = {f"work-{n}.txt": f"change {n}\n"}
        if n in failing:
            files[f"FAIL_{n}"] = "this change breaks the tests\n"
        branch = f"polecat/p{n}/{bead}"
        head = pt.push_branch(branch, files)
        beads.append(bead)
        mrs.append(await pt.submit(bead, branch, head))
    return beads, mrs


async def test_a_batch_lands_in_one_push_and_bisecting_names_each_culprit(
    pt: PolecatTown, gt_env: dict[str, str]
) -> None:
    await pt.add_rig(test_command=FAILS_ON_MARKERS)
    before = main_head(pt)
    beads, ids = await queue_branches(pt, 8, failing={3, 6})
    mrs = await settled(pt, ids)

    assert [mrs[i].status for i in ids] == ["merged", "merged", "failed", "merged", "merged", "failed"] + ["merged"] * 2
    assert (mrs[ids[2]].gate, mrs[ids[5]].gate) == ("test", "test")
    landed = [ids[n - 1] for n in (1, 2, 4, 5, 7, 8)]
    head = main_head(pt)
    for mr_id in landed:
        assert mrs[mr_id].merged_commit == head, "all landed with one push"
        assert mrs[mr_id].batch == landed
    # Stack of 8, red: the target is checked (green), 3 probes find #3; #4-#8 restacked, red: 2 probes find #6;
    # #7-#8 restacked, green. Serial mode would need 8 runs plus one on the target per failure.
    merged_events = [data for mr_id in landed for kind, data in await mr_events(pt, mr_id) if kind == "mr.merged"]
    assert {e["gates_run"] for e in merged_events} == {9}
    assert pt.refinery is not None
    assert pt.refinery.gate_runs == 9
    claims = [data for mr_id in ids for kind, data in await mr_events(pt, mr_id) if kind == "mr.claimed"]
    assert len(claims) == 8
    assert all(c["batch"] == ids for c in claims), "the 8 were claimed as one batch"

    subjects = git.git("log", "--format=%s", f"{before}..refs/heads/main", cwd=pt.origin).splitlines()
    assert [s.split(": ")[1] for s in reversed(subjects)] == [f"work-{n}.txt" for n in (1, 2, 4, 5, 7, 8)]
    assert main_tree(pt) == sorted(["README.md", *(f"work-{n}.txt" for n in (1, 2, 4, 5, 7, 8))])

    mayor = pt.mayor
    assert mayor is not None
    closed = {beads[n - 1] for n in (1, 2, 4, 5, 7, 8)}
    await assert_eventually(lambda: all(mayor.projection.state.beads[b].status == "closed" for b in closed))
    assert mayor.projection.state.beads[beads[2]].status != "closed"

    env = {**gt_env, "NATS_URL": pt.config.nats_url}
    listed = await run_gt(env, "mq", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    assert {i: rows[i]["status"] for i in ids} == {i: mrs[i].status for i in ids}
    shown = await run_gt(env, "mq", "show", ids[5], "--json")
    assert shown.returncode == 0, shown.stderr
    culprit = json.loads(shown.stdout)
    assert (culprit["status"], culprit["gate"], culprit["exit_code"]) == ("failed", "test", 1)
    assert culprit["batch"] == ids
    text = await run_gt(env, "mq", "show", landed[0])
    assert text.returncode == 0
    assert "status: merged" in text.stdout
    assert f"batch: {', '.join(landed)}" in text.stdout


@pytest.mark.parametrize("batch", [RefinerySettings(batch=2, batch_wait_s=5)])
async def test_a_member_that_only_clashes_with_another_is_deferred_not_blamed(pt: PolecatTown) -> None:
    await pt.add_rig(test_command=FAILS_ON_MARKERS)
    first, second = await pt.new_bead("Write NOTES", prefix="demo"), await pt.new_bead("Also NOTES", prefix="demo")
    head_a = pt.push_branch("polecat/a/x", {"NOTES.txt": "from a\n"})
    head_b = pt.push_branch("polecat/b/x", {"NOTES.txt": "from b\n"})
    mr_a = await pt.submit(first, "polecat/a/x", head_a)
    mr_b = await pt.submit(second, "polecat/b/x", head_b)

    def blocked() -> MergeRequest:
        mr = mrs_of(pt).get(mr_b)
        assert mr is not None, "the refinery has not applied the submission yet"
        assert mr.status == "blocked", mr.status
        assert mr.blocked_by
        return mr

    await assert_eventually(blocked, timeout=120, interval=0.1)
    assert mrs_of(pt)[mr_a].status == "merged"
    kinds = [(kind, data.get("reason", "")) for kind, data in await mr_events(pt, mr_b)]
    requeued = [reason for kind, reason in kinds if kind == "mr.requeued"]
    assert requeued, kinds
    assert f"does not apply on top of {mr_a}" in requeued[0]
    assert "mr.failed" not in [kind for kind, _ in kinds], "a clash inside the batch blames nobody"
    assert git.git("show", "refs/heads/main:NOTES.txt", cwd=pt.origin) == "from a\n"


@pytest.mark.parametrize("batch", [RefinerySettings()])
async def test_a_target_that_moves_under_the_merge_requeues_it_and_it_lands_on_top(
    pt: PolecatTown, tmp_path: Path
) -> None:
    # Someone pushes to main while the gates run (the gate itself does it, once): the fast-forward is refused.
    mover = tmp_path / "mover"
    git.git("clone", "--quiet", str(pt.origin), str(mover))
    (mover / "MOVED.txt").write_text("pushed during the gates\n")
    git.git("add", ".", cwd=mover)
    git.git("-c", "user.name=Someone", "-c", "user.email=someone@test.invalid", "commit", "-qm", "moved", cwd=mover)
    flag = tmp_path / "moved-once"
    gate = f"if [ ! -e {flag} ]; then touch {flag} && git -C {mover} push -q origin HEAD:main; fi; test ! -e FAIL"
    await pt.add_rig(test_command=gate)
    bead = await pt.new_bead("Land after the move", prefix="demo")
    head = pt.push_branch("polecat/m/x", {"mine.txt": "my change\n"})
    mr_id = await pt.submit(bead, "polecat/m/x", head)

    mrs = await settled(pt, [mr_id])
    assert mrs[mr_id].status == "merged"
    kinds = [(kind, data) for kind, data in await mr_events(pt, mr_id)]
    reasons = [data["reason"] for kind, data in kinds if kind == "mr.requeued"]
    assert reasons == ["the target moved during the merge"]
    assert [kind for kind, _ in kinds].count("mr.claimed") == 2
    assert main_tree(pt) == ["MOVED.txt", "README.md", "mine.txt"]
    subjects = git.git("log", "--format=%s", "refs/heads/main", cwd=pt.origin).splitlines()
    assert subjects[:2] == ["polecat/m/x: mine.txt", "moved"], "landed once, on top of what moved"
