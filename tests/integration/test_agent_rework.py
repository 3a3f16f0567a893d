"""The reference agent and the merge queue together: what the agent commits (only what it wrote, never build
output), and a merge conflict going back to an agent before it reaches the operator."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
from nats.aio.client import Client

from services.refinery.settings import RefinerySettings
from shared.core.config import TownConfig
from shared.host import git
from tests.helpers import assert_eventually
from tests.integration.test_refinery import conflict_blocked, main_files, merged_mr
from tests.log_tools import events_of
from tests.witness_town import IDENTITY, PolecatTown, polecat_town, run_gt

BUILD_OUTPUT = ("__pycache__", ".pyc", ".pytest_cache", "node_modules")


def commit_to_main(pt: PolecatTown, files: dict[str, str]) -> None:
    clone = pt.origin.parent / "main-writer"
    git.git("clone", "--quiet", str(pt.origin), str(clone))
    for name, text in files.items():
        (clone / name).write_text(text)
    git.git("add", *files, cwd=clone)
    git.git(*IDENTITY, "commit", "--quiet", "-m", "add a module", cwd=clone)
    git.git("push", "--quiet", "origin", "HEAD:main", cwd=clone)
    git.force_remove(clone)


async def test_the_agent_commits_only_what_it_wrote_never_python_bytecode(pt: PolecatTown) -> None:
    # A Python project with no .gitignore: its test command leaves __pycache__/mod.*.pyc in the worktree.
    commit_to_main(pt, {"mod.py": "VALUE = 1\n"})
    await pt.add_rig(test_command="python3 -c 'import mod' && test ! -e FAIL_TESTS")
    bead = await pt.new_bead("Work on a Python project")
    await pt.sling(bead)
    mr = await merged_mr(pt, bead, timeout=180)
    tree = git.git("ls-tree", "-r", "--name-only", "refs/heads/main", cwd=pt.origin).split()
    assert [p for p in tree if any(b in p for b in BUILD_OUTPUT)] == [], tree
    assert f".gastown-work/{bead}/05-run-tests.txt" in tree
    assert mr["head"]
    sessions = await pt.wait_settled(bead)
    assert [s.end_reason for s in sessions] == ["done"], "gt done took the worktree as clean"


async def test_a_file_the_agent_left_uncommitted_is_committed_by_the_next_session_and_the_bead_merges(
    pt: PolecatTown,
) -> None:
    """The `dirty` fault: attempt 1 leaves its own file uncommitted and `gt done` refuses the worktree. The next
    session commits what its predecessor left of the agent's own files (found by the 60-bead chaos run: a
    session that committed only its step files left it there, and every later session failed `gt done`)."""
    await pt.add_rig(agent_command="GT_AGENT_FAULT=dirty@1 gt-agent", max_respawns=2)
    bead = await pt.new_bead("Leave a file behind once")
    await pt.sling(bead)
    await merged_mr(pt, bead, timeout=180)
    tree = git.git("ls-tree", "-r", "--name-only", "refs/heads/main", cwd=pt.origin).split()
    assert "scratch.txt" in tree
    sessions = await pt.wait_settled(bead)
    assert [s.end_reason for s in sessions][-1] == "done"
    assert len(sessions) == 2, [(s.id, s.end_reason) for s in sessions]


async def test_a_conflict_goes_back_to_the_agent_which_resolves_it_and_it_merges(
    pt: PolecatTown, gt_env: dict[str, str]
) -> None:
    await pt.add_rig(agent_command="GT_AGENT_FAULT=conflict gt-agent", max_polecats=2)
    # Both branch off the same main and both write CONFLICT.txt: whichever merges second conflicts.
    beads = [await pt.new_bead("Write CONFLICT.txt"), await pt.new_bead("Also write CONFLICT.txt")]
    for bead in beads:
        await pt.sling(bead)

    async def conflicted() -> tuple[str, dict[str, Any]]:
        for bead in beads:
            assert pt.refinery is not None
            for mr in [m for m in pt.refinery.projection.state.mrs.values() if m.bead == bead]:
                for kind, data in await events_of(pt.nc, f"gt.evt.mr.{mr.id}"):
                    if kind == "mr.conflicted":
                        return bead, data
        raise AssertionError("no merge request conflicted yet")

    found: tuple[str, dict[str, Any]] = await assert_eventually(conflicted, timeout=180, interval=0.2)
    second, conflict = found
    first = next(b for b in beads if b != second)
    assert conflict["sent_back"] is True
    assert conflict["files"] == ["CONFLICT.txt"]

    # The bead merges without anyone else: a fresh session on it rebased, resolved and submitted again.
    await merged_mr(pt, first, timeout=180)
    await merged_mr(pt, second, timeout=240)
    # The agent integrated its change with what landed: the line that landed stands, its own contradicting version
    # of that line is not put beside it (a union merge left both), and the rest of its work is re-applied.
    content = git.git("show", "refs/heads/main:CONFLICT.txt", cwd=pt.origin)
    assert content == f"{first} was here\n", content
    assert main_files(pt, second), "the rest of the reworked bead's change landed"
    sessions = await pt.wait_settled(second)
    # The first submitted; a later one (the next, unless the machine's load made one die on the way) resolved.
    assert len(sessions) >= 2, [(s.id, s.end_reason) for s in sessions]
    assert (sessions[0].end_reason, sessions[-1].end_reason) == ("done", "done")
    assert {s.branch for s in sessions} == {sessions[0].branch}, "the same branch, reworked"
    assert pt.mayor is not None
    labelled = [b for b in pt.mayor.projection.state.beads.values() if "merge-conflict" in b.labels]
    assert labelled == [], "no conflict bead for the operator"

    # The send-back appended one round of rework steps to the molecule, after the done ones, which stayed done: every
    # step done once, the formula's before the round was added, the round's after; the molecule completed once.
    events = await events_of(pt.nc, f"gt.evt.mol.{second}")
    kinds = [kind for kind, _ in events]
    [added] = [data for kind, data in events if kind == "molecule.rework_added"]
    assert (added["round"], added["reason"], added["mr_id"]) == (1, "conflict", conflict["mr_id"])
    rework_ids = [step["id"] for step in added["steps"]]
    assert rework_ids == ["rework-1-rebase", "rework-1-run-tests", "rework-1-submit"]
    assert conflict["target_commit"] in added["steps"][0]["description"]
    formula_ids = [step["id"] for step in events[0][1]["steps"]]
    done = [data["step"] for kind, data in events if kind == "step.done"]
    assert sorted(done) == sorted(formula_ids + rework_ids), "every step done exactly once, none redone"
    at = kinds.index("molecule.rework_added")
    assert [d["step"] for k, d in events[:at] if k == "step.done"] == formula_ids
    assert [d["step"] for k, d in events[at:] if k == "step.done"] == rework_ids
    assert [d["step"] for k, d in events[at:] if k == "step.started"] == [], "no done step started again"
    assert kinds.count("molecule.completed") == 1
    first_events = await events_of(pt.nc, f"gt.evt.mol.{first}")
    assert "molecule.rework_added" not in [kind for kind, _ in first_events], "the first merged as it was"

    # What the fresh session was told: `gt prime` of it names the conflict, its files and the target commit.
    env = {**gt_env, "NATS_URL": pt.config.nats_url, "GT_SESSION": sessions[-1].id}
    primed = await run_gt(env, "prime")
    assert primed.returncode == 0, primed.stderr
    assert "conflicted" in primed.stdout
    assert "CONFLICT.txt" in primed.stdout
    assert conflict["target_commit"] in primed.stdout
    data = json.loads((await run_gt(env, "prime", "--json")).stdout)
    assert data["merge_failure"]["gate"] == "conflict"
    assert data["merge_failure"]["files"] == ["CONFLICT.txt"]


async def test_a_session_sent_a_conflict_is_pointed_at_the_rework_step_not_told_to_run_gt_done(
    pt: PolecatTown, gt_env: dict[str, str]
) -> None:
    """Found by a new user's trial: after a conflict the fresh session's beacon said "current step (none: all
    done)", the Stop hook and `gt prime` said to run `gt done`, and the rebase came further down. Here the sent-back
    session's agent waits (``hang@2``) so what it was told can be read: the beacon, `gt prime`, the Stop hook and
    `gt mol status` all point at the round's first rework step."""
    await pt.add_rig(agent_command="GT_AGENT_FAULT=conflict,hang@2 gt-agent", max_polecats=2)
    beads = [await pt.new_bead("Write CONFLICT.txt"), await pt.new_bead("Also write CONFLICT.txt")]
    for bead in beads:
        await pt.sling(bead)

    def sent_back() -> tuple[str, Any]:
        for bead in beads:
            sessions = pt.sessions_of(bead)
            if len(sessions) >= 2 and sessions[-1].status == "started":
                return bead, sessions[-1]
        raise AssertionError([(b, [(s.id, s.status) for s in pt.sessions_of(b)]) for b in beads])

    found: tuple[str, Any] = await assert_eventually(sent_back, timeout=240, interval=0.2)
    bead, session = found
    assert pt.refinery is not None
    [conflicted] = [m for m in pt.refinery.projection.state.mrs.values() if m.bead == bead]
    [(_, conflict)] = [(k, d) for k, d in await events_of(pt.nc, f"gt.evt.mr.{conflicted.id}") if k == "mr.conflicted"]

    # The beacon it was started with (its environment, as the witness gave it: the agent's, below the pane's reaper,
    # which starts it a moment after the session is recorded started).
    def agent_of_pane() -> psutil.Process:
        children = psutil.Process(session.pane_pid).children()
        assert len(children) == 1, children
        return children[0]

    agent = await assert_eventually(agent_of_pane, timeout=30, interval=0.1)
    environ = Path(f"/proc/{agent.pid}/environ").read_bytes().split(b"\0")
    [beacon] = [e.decode().removeprefix("GT_BEACON=") for e in environ if e.startswith(b"GT_BEACON=")]
    assert "current step rework-1-rebase" in beacon, beacon
    assert "sent your work back" in beacon
    assert "all done" not in beacon

    env = {
        **gt_env,
        "NATS_URL": pt.config.nats_url,
        "GT_SESSION": session.id,
        "GT_BEAD": bead,
        "GT_RIG": "demo",
        "GT_WORKTREE": session.worktree,
        "GT_BRANCH": session.branch,
    }
    primed = await run_gt(env, "prime")
    assert primed.returncode == 0, primed.stderr
    lines = primed.stdout.splitlines()
    assert lines[2].startswith(f"Hook: bead {bead}"), primed.stdout
    assert lines[4].startswith("The merge queue sent this work back"), primed.stdout
    assert "CONFLICT.txt" in lines[4]
    assert conflict["target_commit"] in lines[4]
    assert "Current step: rework-1-rebase" in primed.stdout
    assert "Every step is done" not in primed.stdout

    stop = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gt.cli.main", "agent-hook", "stop"],
        env=env,
        input="{}",
        capture_output=True,
        text=True,
        check=False,
    )
    assert stop.returncode == 0, stop.stderr
    decision = json.loads(stop.stdout)
    assert decision["decision"] == "block"
    assert "rework-1-rebase" in decision["reason"]
    assert "run `gt done`" not in decision["reason"]

    status = await run_gt(env, "mol", "status", bead)
    assert status.returncode == 0, status.stderr
    assert "current step: rework-1-rebase" in status.stdout
    assert "rework-1-submit" in status.stdout


async def test_a_conflict_the_agents_do_not_resolve_reaches_the_operator_after_the_cap(
    town: TownConfig, nc: Client, tmp_path: Path
) -> None:
    # No conflict goes back to an agent (cap 0): the first one is the operator's, as a conflict bead.
    async with polecat_town(town, nc, tmp_path, refinery=RefinerySettings(max_conflict_returns=0)) as pt:
        _, mr = await conflict_blocked(pt, timeout=180)
        assert mr.blocked_by is not None
        assert pt.mayor is not None
        conflict_bead = pt.mayor.projection.state.beads[mr.blocked_by]
        assert "merge-conflict" in conflict_bead.labels
        assert len(pt.sessions_of(mr.bead)) == 1, "no session was sent the conflict"
