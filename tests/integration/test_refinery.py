"""The merge queue end to end from `gt done`, with real git, real gates and the reference agent: clean merges,
failing tests sent back to the polecat, a failure the target has too, conflicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.refinery.service import RefineryService
from services.refinery.state import MergeRequest
from shared.host import git
from tests.helpers import assert_eventually
from tests.log_tools import events_of
from tests.witness_town import PolecatTown, run_gt

STEPS = ("load-context", "implement", "commit", "self-review", "run-tests", "submit")


async def queue_paused(refinery: RefineryService, rig: str, ids: list[str]) -> Any:
    """Once ``rig``'s merge queue is paused with every one of ``ids`` back in it (none claimed): its record."""

    def paused() -> Any:
        queue = refinery.projection.state.queues.get(rig)
        assert queue is not None, "the queue is not paused"
        assert queue.paused, "the queue is not paused"
        statuses = [refinery.projection.state.mrs[i].status for i in ids]
        assert "claimed" not in statuses, "the merge request that met the cause is not back in the queue yet"
        return queue

    return await assert_eventually(paused, timeout=120, interval=0.1)


async def merged_mr(pt: PolecatTown, bead: str, timeout: float = 120) -> dict[str, Any]:
    def merged() -> dict[str, Any]:
        assert pt.refinery is not None
        found = [m for m in pt.refinery.projection.state.mrs.values() if m.bead == bead and m.status == "merged"]
        assert found, [(m.id, m.status) for m in pt.refinery.projection.state.mrs.values()]
        view: dict[str, Any] = msgspec.to_builtins(found[0])
        return view

    result: dict[str, Any] = await assert_eventually(merged, timeout=timeout, interval=0.1)
    return result


async def bead_events(pt: PolecatTown, bead: str) -> list[tuple[str, dict[str, Any]]]:
    return await events_of(pt.nc, f"gt.evt.bead.{bead}")


def main_files(pt: PolecatTown, bead: str) -> list[str]:
    out = git.git("ls-tree", "--name-only", "refs/heads/main", f".gastown-work/{bead}/", cwd=pt.origin)
    return sorted(Path(p).name for p in out.split())


async def conflict_blocked(pt: PolecatTown, timeout: float) -> tuple[list[str], MergeRequest]:
    """Two beads slung to a new rig whose agents both write CONFLICT.txt, branching off the same main: whichever
    merges second conflicts. Its merge request, once blocked on a conflict bead (the operator's)."""
    await pt.add_rig(agent_command="GT_AGENT_FAULT=conflict gt-agent", max_polecats=2)
    beads = [await pt.new_bead("Write CONFLICT.txt"), await pt.new_bead("Also write CONFLICT.txt")]
    for bead in beads:
        await pt.sling(bead)

    def blocked() -> MergeRequest:
        assert pt.refinery is not None
        found = [m for m in pt.refinery.projection.state.mrs.values() if m.status == "blocked" and m.blocked_by]
        assert found, [(m.bead, m.status) for m in pt.refinery.projection.state.mrs.values()]
        return found[0]

    mr: MergeRequest = await assert_eventually(blocked, timeout=timeout, interval=0.1)
    return beads, mr


def temp_worktrees(pt: PolecatTown, rig: str = "demo") -> list[str]:
    work = pt.config.gt_home / "rigs" / rig / "refinery" / "work"
    return sorted(p.name for p in work.iterdir()) if work.exists() else []


async def test_a_clean_branch_is_rebased_gated_merged_and_its_bead_closed_once(pt: PolecatTown) -> None:
    await pt.add_rig()
    bead = await pt.new_bead("Merge me")
    await pt.sling(bead)
    mr = await merged_mr(pt, bead)
    assert mr["merged_commit"] == git.git("rev-parse", "refs/heads/main", cwd=pt.origin).strip()
    assert main_files(pt, bead) == [f"{i:02d}-{s}.txt" for i, s in enumerate(STEPS, 1)]

    async def closed() -> list[dict[str, Any]]:
        closes = [data for kind, data in await bead_events(pt, bead) if kind == "bead.closed"]
        assert closes
        return closes

    closes: list[dict[str, Any]] = await assert_eventually(closed, timeout=30)
    assert [c["reason"] for c in closes] == [f"merged in {mr['id']}"]
    branch = f"refs/heads/{mr['branch']}"
    await assert_eventually(
        lambda: not git.git("rev-parse", "--verify", "--quiet", branch, cwd=pt.origin, check=False).strip(),
        message="the polecat branch is deleted once merged",
    )
    assert temp_worktrees(pt) == []
    assert pt.mayor is not None
    convoys = [c for c in pt.mayor.projection.state.convoys.values() if bead in c.beads]
    await assert_eventually(lambda: all(c.status == "closed" for c in convoys), message="its convoy closed")


async def test_failing_tests_send_the_work_back_and_the_fixed_branch_merges(pt: PolecatTown) -> None:
    await pt.add_rig(agent_command="GT_AGENT_FAULT=fail-tests@1 gt-agent")
    bead = await pt.new_bead("Fail first, then pass")
    await pt.sling(bead)
    mr = await merged_mr(pt, bead, timeout=180)
    assert pt.refinery is not None
    mrs = [m for m in pt.refinery.projection.state.mrs.values() if m.bead == bead]
    failed = [m for m in mrs if m.status == "failed"]
    assert len(failed) == 1
    assert (failed[0].gate, failed[0].exit_code) == ("test", 1)
    sessions = await pt.wait_settled(bead)
    assert sessions[0].end_reason == "done"
    assert len(sessions) >= 2, "a fresh session got the work back"
    assert sessions[-1].end_reason == "done"
    assert mr["id"] != failed[0].id
    tree = git.git("ls-tree", "--name-only", "refs/heads/main", cwd=pt.origin).split()
    assert "FAIL_TESTS" not in tree
    # The failure came back as a round of rework steps appended to the molecule, worked by the fresh session.
    assert pt.mayor is not None
    steps = [(s.id, s.status) for s in pt.mayor.projection.state.molecules[bead].steps]
    assert steps[-3:] == [("rework-1-fix", "done"), ("rework-1-run-tests", "done"), ("rework-1-submit", "done")]
    assert all(status == "done" for _, status in steps)


@pytest.mark.parametrize("gate", ["false", "no-such-tool --check ."])
async def test_a_gate_that_fails_on_the_target_twice_pauses_the_queue_and_a_resume_after_fixing_it_merges(
    pt: PolecatTown, gt_env: dict[str, str], gate: str
) -> None:
    """A gate that cannot pass (`--test false`, a missing tool) fails on every change and on main: nothing merges
    ungated. The first failure on main sends the merge requests back into the queue, the second in a row pauses
    the rig's queue with one escalation; the operator fixes the gate with `gt rig update` and `gt mq resume`
    lands both changes."""
    env = {**gt_env, "NATS_URL": pt.config.nats_url}
    await pt.add_rig(test_command=gate)
    before = git.git("rev-parse", "refs/heads/main", cwd=pt.origin).strip()
    ids = []
    for n in (1, 2):
        bead = await pt.new_bead(f"Change {n}", prefix="demo")
        head = pt.push_branch(f"polecat/p{n}/{bead}", {f"work-{n}.txt": f"change {n}\n"})
        ids.append(await pt.submit(bead, f"polecat/p{n}/{bead}", head))
    assert pt.refinery is not None
    refinery = pt.refinery

    queue = await queue_paused(refinery, "demo", ids)
    assert queue.cause == "gate_broken"
    assert "gt rig update demo --test" in queue.reason
    kinds = [kind for kind, _ in await events_of(pt.nc, "gt.evt.mq.demo")]
    assert kinds == ["mq.target_failed", "mq.paused"], "paused at the second failure on main in a row"
    assert [refinery.projection.state.mrs[i].status for i in ids] == ["queued", "queued"], "nobody was blamed"
    assert git.git("rev-parse", "refs/heads/main", cwd=pt.origin).strip() == before, "nothing merged ungated"
    assert pt.mayor is not None
    mayor = pt.mayor

    def one_escalation() -> list[Any]:
        raised = [e for e in mayor.projection.state.escalations.values() if e.source == "refinery/demo"]
        assert raised, "no escalation yet"
        return raised

    [raised] = await assert_eventually(one_escalation, timeout=30)
    assert "paused" in raised.message
    assert "gt mq resume demo" in raised.message
    assert not [b for b in mayor.projection.state.beads.values() if b.type == "bug"], "no bug bead: nothing merged"

    updated = await run_gt(env, "rig", "update", "demo", "--test", "test -e README.md")
    assert updated.returncode == 0, updated.stderr
    resumed = await run_gt(env, "mq", "resume", "demo")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed" in resumed.stdout

    def merged() -> bool:
        mrs = refinery.projection.state.mrs
        assert [mrs[i].status for i in ids] == ["merged", "merged"], [(mrs[i].status, mrs[i].reason) for i in ids]
        return True

    await assert_eventually(merged, timeout=120, interval=0.1)
    for mr_id in ids:
        merges = [kind for kind, _ in await events_of(pt.nc, f"gt.evt.mr.{mr_id}") if kind == "mr.merged"]
        assert merges == ["mr.merged"], f"{mr_id} merged {len(merges)} times"
    assert len(one_escalation()) == 1


async def test_a_conflict_blocks_the_mr_on_a_conflict_bead_and_closing_it_requeues(pt: PolecatTown) -> None:
    assert pt.refinery is not None  # conflicts are the operator's at once (none goes back to an agent first)
    pt.refinery.policy = msgspec.structs.replace(pt.refinery.policy, max_conflict_returns=0)
    beads, mr = await conflict_blocked(pt, timeout=120)
    assert mr.blocked_by is not None
    second = mr.bead
    first = next(b for b in beads if b != second)
    await merged_mr(pt, first)
    assert pt.mayor is not None
    conflict = pt.mayor.projection.state.beads[mr.blocked_by]
    assert conflict.priority == 1
    assert conflict.metadata["mr"] == mr.id
    assert "CONFLICT.txt" in conflict.description
    assert "never both sides of a conflict side by side" in " ".join(conflict.description.split())
    assert git.git("rev-parse", f"refs/heads/{mr.branch}", cwd=pt.origin).strip(), "the branch is kept"

    # Someone resolves it: rebase the branch onto main, keep both lines, force-push, close the bead.
    work = pt.config.gt_home.parent / "resolver"
    git.git("clone", "--quiet", str(pt.origin), str(work))
    git.git("checkout", "--quiet", mr.branch, cwd=work)
    git.git("rebase", "origin/main", cwd=work, check=False)
    (work / "CONFLICT.txt").write_text(f"{first} was here\n{second} was here\n")
    git.git("add", "CONFLICT.txt", cwd=work)
    git.git("-c", "core.editor=true", "rebase", "--continue", cwd=work)
    git.git("push", "--quiet", "--force", "origin", f"HEAD:{mr.branch}", cwd=work)
    await pt.ok("gt.cmd.bead.close", id=mr.blocked_by, reason="resolved")
    merged = await merged_mr(pt, second)
    assert merged["id"] == mr.id
    content = git.git("show", "refs/heads/main:CONFLICT.txt", cwd=pt.origin)
    assert first in content
    assert second in content


async def test_bad_merge_requests_get_clear_outcomes_and_change_nothing(
    pt: PolecatTown, gt_env: dict[str, str]
) -> None:
    await pt.add_rig()
    before = git.git("rev-parse", "refs/heads/main", cwd=pt.origin).strip()
    unknown = await pt.command(
        "gt.cmd.mr.submit", bead="demo-nosuch", rig="demo", branch="polecat/x/demo-nosuch", head="ab" * 20
    )
    assert (unknown["type"], unknown["code"]) == ("cmd.rejected", "not_found")
    bead = await pt.new_bead("A branch nobody pushed", prefix="demo")
    submitted = await pt.ok("gt.cmd.mr.submit", bead=bead, rig="demo", branch="polecat/ghost/none", head="cd" * 20)

    def failed() -> Any:
        assert pt.refinery is not None
        mr = pt.refinery.projection.state.mrs.get(submitted["id"])
        assert mr is not None, "the refinery has not applied the merge request yet"
        assert mr.status == "failed", mr.status
        return mr

    mr = await assert_eventually(failed, timeout=60)
    assert mr.gate == "branch"
    assert "does not exist" in mr.tail
    assert git.git("rev-parse", "refs/heads/main", cwd=pt.origin).strip() == before
    env = {**gt_env, "NATS_URL": pt.config.nats_url}
    shown = await run_gt(env, "mq", "show", mr.id)
    assert shown.returncode == 0, shown.stderr
    assert "gate: branch" in shown.stdout
    assert "does not exist" in shown.stdout
    rejected = await run_gt(env, "mq", "reject", mr.id, "--reason", "bogus")
    assert rejected.returncode == 0, rejected.stderr
    assert f"{mr.id}: rejected" in rejected.stdout
    retried = await run_gt(env, "mq", "retry", "mr-nosuch")
    assert retried.returncode == 1
    assert "no merge request 'mr-nosuch'" in retried.stdout + retried.stderr
    again = await pt.command("gt.cmd.mr.reject", id="mr-nosuch")
    assert (again["type"], again["code"]) == ("cmd.rejected", "not_found")


async def test_a_test_failure_left_by_a_session_that_died_before_the_merge_queue_is_fixed_by_the_next(
    pt: PolecatTown,
) -> None:
    """Found by the cluster chaos run: the first session made the tests fail, committed that, and was killed
    before `gt step done`. The next sessions met the failing tests at the same step and gave up, one after
    the other, until the witness escalated the bead. The reference agent fixes what it knows it broke."""
    await pt.add_rig(agent_command="GT_AGENT_FAULT=fail-tests@1,crash-at-step=5@1 gt-agent", max_respawns=3)
    bead = await pt.new_bead("Fail, die, then pass")
    await pt.sling(bead)
    await merged_mr(pt, bead, timeout=180)
    sessions = await pt.wait_settled(bead)
    assert sessions[0].end_reason != "done", "the first session died"
    assert sessions[-1].end_reason == "done"
    tree = git.git("ls-tree", "--name-only", "refs/heads/main", cwd=pt.origin).split()
    assert "FAIL_TESTS" not in tree
