"""A merge request belongs to its bead: branches that bring nothing new for their bead are settled at once.

Found in the town: an agent whose branch head was a commit another bead had submitted already ran `gt done`;
`mr.submit` answered with the other bead's merge request (they were keyed on rig and head), so the bead stayed
hooked with no merge request of its own until the deacon's stale-hook check re-slung it, to the same end.

Here real agents (shell commands in tmux) run the real `gt done`; the outcome is read back from the log.
"""

from __future__ import annotations

from typing import Any

from shared.host import git
from tests.helpers import assert_eventually
from tests.log_tools import events_of
from tests.witness_town import IDENTITY, PolecatTown


def agent_submitting(commit: str, fetch: str | None = None) -> str:
    """An agent whose branch ends at ``commit`` (fetched from origin's branch ``fetch`` first), then `gt done`."""
    get = f"git fetch --quiet origin {fetch} && " if fetch else ""
    return f"{get}git reset --quiet --hard {commit} && gt done"


def push_to_main(pt: PolecatTown, name: str, text: str) -> str:
    """Push one commit onto origin's main (as another merge would); the new head."""
    clone = pt.origin.parent / f"main-{name}"
    git.git("clone", "--quiet", "--branch", "main", str(pt.origin), str(clone))
    try:
        (clone / name).write_text(text)
        git.git("add", name, cwd=clone)
        git.git(*IDENTITY, "commit", "--quiet", "-m", f"main: {name}", cwd=clone)
        git.git("push", "--quiet", "origin", "HEAD:main", cwd=clone)
        return git.git("rev-parse", "HEAD", cwd=clone).strip()
    finally:
        git.force_remove(clone)


def main_head(pt: PolecatTown) -> str:
    return git.git("rev-parse", "refs/heads/main", cwd=pt.origin).strip()


async def submitted(pt: PolecatTown) -> list[dict[str, Any]]:
    """Every mr.submitted in the log."""
    return [data for kind, data in await events_of(pt.nc, "gt.evt.mr.>") if kind == "mr.submitted"]


async def closed_beads(pt: PolecatTown, beads: list[str], timeout: float = 150) -> dict[str, str]:
    """Until every bead in ``beads`` has its bead.closed in the log; bead -> its close reason."""

    async def all_closed() -> dict[str, str]:
        reasons: dict[str, str] = {}
        for bead in beads:
            closes = [data for kind, data in await events_of(pt.nc, f"gt.evt.bead.{bead}") if kind == "bead.closed"]
            assert len(closes) <= 1, closes
            if closes:
                reasons[bead] = str(closes[0]["reason"])
        mrs = [(m["bead"], m["mr_id"]) for m in await submitted(pt)]
        assert set(reasons) == set(beads), f"closed: {reasons}; merge requests in the log: {mrs}"
        return reasons

    result: dict[str, str] = await assert_eventually(all_closed, timeout=timeout, interval=0.5)
    return result


def mrs_by_bead(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        out.setdefault(str(event["bead"]), []).append(event)
    return out


async def test_two_beads_whose_branches_hold_the_same_commit_each_get_their_own_mr_and_both_close(
    pt: PolecatTown,
) -> None:
    # One commit, not on main yet, that both agents end their branches at (say both made the same fix).
    shared = pt.push_branch("shared-work", {"FIX.txt": "the one fix both beads need\n"})
    await pt.add_rig(agent_command=agent_submitting(shared, fetch="shared-work"), max_polecats=2)
    beads = [await pt.new_bead("Fix it", prefix="demo"), await pt.new_bead("Fix it too", prefix="demo")]
    for bead in beads:
        await pt.sling(bead)

    reasons = await closed_beads(pt, beads)
    by_bead = mrs_by_bead(await submitted(pt))
    assert sorted(by_bead) == sorted(beads), by_bead
    assert all(len(mrs) == 1 for mrs in by_bead.values()), by_bead
    ids = {bead: mrs[0]["mr_id"] for bead, mrs in by_bead.items()}
    assert len(set(ids.values())) == 2, "each bead has a merge request of its own"
    assert all(mrs[0]["head"] == shared for mrs in by_bead.values())
    # One of them landed the commit; the other found it on main and names the one that landed it.
    landed = [b for b in beads if reasons[b] == f"merged in {ids[b]}"]
    assert len(landed) == 1, reasons
    other = next(b for b in beads if b not in landed)
    assert reasons[other].startswith(f"merged in {ids[other]}"), reasons
    assert "already on main" in reasons[other], reasons
    assert f"{ids[landed[0]]} (bead {landed[0]})" in reasons[other], reasons
    assert git.git("ls-tree", "--name-only", "refs/heads/main", cwd=pt.origin).split() == ["FIX.txt", "README.md"]
    for bead in beads:
        sessions = await pt.wait_settled(bead)
        assert [s.end_reason for s in sessions] == ["done"], "no second session: nothing was re-slung"


async def test_beads_whose_heads_are_already_on_the_target_close_at_once_as_already_merged(pt: PolecatTown) -> None:
    # Two agents that found nothing to do: their branches end at a commit main already has (main moved on).
    old = main_head(pt)
    push_to_main(pt, "LATER.txt", "main moved on\n")
    target = main_head(pt)
    await pt.add_rig(agent_command=agent_submitting(old), max_polecats=2)
    beads = [await pt.new_bead("Nothing to do", prefix="demo"), await pt.new_bead("Nothing either", prefix="demo")]
    for bead in beads:
        await pt.sling(bead)

    reasons = await closed_beads(pt, beads)
    by_bead = mrs_by_bead(await submitted(pt))
    assert sorted(by_bead) == sorted(beads), by_bead
    ids = {bead: mrs[0]["mr_id"] for bead, mrs in by_bead.items()}
    assert len(set(ids.values())) == 2, "each bead has a merge request of its own"
    for bead in beads:
        assert reasons[bead].startswith(f"merged in {ids[bead]}"), reasons
        assert "already on main" in reasons[bead], reasons
        merged = [d for k, d in await events_of(pt.nc, f"gt.evt.mr.{ids[bead]}") if k == "mr.merged"]
        assert [m["already"] for m in merged] == [True]
    assert main_head(pt) == target, "nothing was pushed"


async def test_a_bead_resubmitting_the_commit_that_failed_is_gated_again_and_escalated_after_the_limit(
    pt: PolecatTown,
) -> None:
    # The agent never fixes its failing test: every session after the first submits the same head again.
    await pt.add_rig(agent_command="GT_AGENT_FAULT=fail-tests gt-agent")
    bead = await pt.new_bead("Never fixed", prefix="demo")
    await pt.sling(bead)

    def escalated() -> list[Any]:
        assert pt.mayor is not None
        found = [e for e in pt.mayor.projection.state.escalations.values() if e.bead == bead]
        assert found, [(s.id, s.end_reason) for s in pt.sessions_of(bead)]
        return found

    escalations = await assert_eventually(escalated, timeout=240, interval=0.5)
    assert "failed its test gate 3 times" in escalations[0].message
    by_bead = mrs_by_bead(await submitted(pt))
    assert [m["bead"] for m in by_bead[bead]] == [bead], "one commit, one merge request"
    mr_id = by_bead[bead][0]["mr_id"]
    kinds = [kind for kind, _ in await events_of(pt.nc, f"gt.evt.mr.{mr_id}")]
    assert kinds.count("mr.failed") == 3, kinds
    assert kinds.count("mr.requeued") == 2, "each unchanged resubmission went back into the queue"
    failed = [d for k, d in await events_of(pt.nc, f"gt.evt.mr.{mr_id}") if k == "mr.failed"]
    assert [f.get("escalated", False) for f in failed] == [False, False, True]
    sessions = await pt.wait_settled(bead)
    assert [s.end_reason for s in sessions] == ["done", "done", "done"], "sent back twice, then escalated:\n" + (
        pt.endings(sessions)
    )
