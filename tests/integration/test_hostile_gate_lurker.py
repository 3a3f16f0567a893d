"""A hostile change's test code starts a process of the gate user out of the gate's process group (setsid), to
forge the verdict of the next change's gate. It must end with its gate (the watcher runs under the pane's reaper):
the next change, whose test fails, is not merged, and the rig's queue is not paused by a lurker killing later gates.
A real refinery, GT_GATE_USER (gates as another user, as the compose stack runs them). Found by the red team
(issue 39), when the watcher stopped the gate's process group only.

The rig's test command runs the repository's own check.sh (as rigs do: `pytest`, `make test`). Change 1 (hostile)
rewrites check.sh to start the lurker, and fails (it is sent back: nothing of it lands). The lurker would delete the
file change 2's check fails on from every later gate's workspace (``/tmp/gt-gates-<town>/<rig>/work``: the rig
dir is 0711, its ``work/`` the gate user's). Change 2 adds that file; its gate must fail."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest
from nats.aio.client import Client

from services.refinery.state import MergeRequest
from shared.core.config import TownConfig
from shared.host import git
from tests.helpers import assert_eventually
from tests.integration.test_gate_user import gate_user  # noqa: F401 - the throwaway gate user fixture
from tests.witness_town import IDENTITY, polecat_town

CHECK = "test ! -e BROKEN\n"
LURKER = "while :; do rm -f /tmp/gt-gates-*/*/work/BROKEN; sleep 0.02; done"


def push(origin: Path, branch: str, files: dict[str, str], base: str = "main") -> str:
    clone = origin.parent / f"scratch-{secrets.token_hex(4)}"
    git.git("clone", "--quiet", "--branch", base, str(origin), str(clone))
    try:
        if branch != base:
            git.git("checkout", "--quiet", "-b", branch, cwd=clone)
        for name, text in files.items():
            (clone / name).write_text(text)
        git.git("add", "-A", ".", cwd=clone)
        git.git(*IDENTITY, "commit", "--quiet", "-m", branch, cwd=clone)
        git.git("push", "--quiet", "origin", f"HEAD:refs/heads/{branch}", cwd=clone)
        return git.git("rev-parse", "HEAD", cwd=clone).strip()
    finally:
        git.force_remove(clone)


@pytest.mark.parametrize("hostile_first", [False, True], ids=["control", "after-hostile"])
async def test_a_hostile_changes_gate_leaves_no_process_to_make_a_failing_change_merge(
    town: TownConfig,
    nc: Client,
    tmp_path: Path,
    gate_user: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    hostile_first: bool,
) -> None:
    monkeypatch.setenv("GT_GATE_USER", gate_user)
    async with polecat_town(town, nc, tmp_path) as pt:
        push(pt.origin, "main", {"check.sh": CHECK}, base="main")  # the project's tests, on main
        await pt.add_rig(test_command="sh check.sh")

        def settled(mr_id: str) -> MergeRequest:
            assert pt.refinery is not None
            mr = pt.refinery.projection.state.mrs.get(mr_id)
            assert mr is not None, "not applied yet"
            assert mr.status in ("merged", "failed", "escalated"), mr.status
            return mr

        if hostile_first:
            await hostile_change(pt, settled)
        broken = await pt.new_bead("A change whose test fails", prefix="demo")
        branch2 = f"polecat/ann/{broken}"
        second = await pt.submit(broken, branch2, push(pt.origin, branch2, {"BROKEN": "its test fails\n"}))
        second_mr = await assert_eventually(lambda: settled(second), timeout=120, interval=0.1)
        lurkers = subprocess.run(["pgrep", "-u", gate_user], capture_output=True, text=True).stdout.split()
        assert second_mr.status != "merged", (
            f"a change whose test fails (check.sh: {CHECK.strip()!r}, and it adds BROKEN) was merged: the hostile "
            f"change's gate left processes of the gate user {lurkers} that removed BROKEN from its gate's clone"
        )


async def hostile_change(pt, settled) -> None:  # type: ignore[no-untyped-def]
    """Change 1: rewrites check.sh to start the lurker (setsid, out of the gate's group), and fails its gate."""
    hostile = await pt.new_bead("Hostile", prefix="demo")
    branch1 = f"polecat/evil/{hostile}"
    head1 = push(
        pt.origin,
        branch1,
        {"check.sh": f"setsid -f sh -c '{LURKER}' </dev/null >/dev/null 2>&1\nexit 1\n"},
    )
    first = await pt.submit(hostile, branch1, head1)
    first_mr = await assert_eventually(lambda: settled(first), timeout=120, interval=0.1)
    assert first_mr.status != "merged", "the hostile change failed its gate (by design)"


KILLER = (
    'cd /; while :; do for d in /proc/[0-9]*; do case "$(readlink $d/cwd 2>/dev/null)" in'
    " /tmp/gt-gates-*/*/work*) kill -9 ${d#/proc/} 2>/dev/null;; esac; done; sleep 0.05; done"
)


async def test_a_hostile_changes_gate_leaves_no_process_to_pause_the_rigs_queue(
    town: TownConfig,
    nc: Client,
    tmp_path: Path,
    gate_user: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lurker that would kill every later gate (its own user's processes working in a gate's clone), so that each
    change fails and so does the target's tip, twice in a row, pausing the rig's whole queue: it ends with the
    hostile change's gate, and the queue is not paused."""
    monkeypatch.setenv("GT_GATE_USER", gate_user)
    async with polecat_town(town, nc, tmp_path) as pt:
        push(pt.origin, "main", {"check.sh": "sleep 1\n"}, base="main")
        await pt.add_rig(test_command="sh check.sh")
        hostile = await pt.new_bead("Hostile", prefix="demo")
        branch1 = f"polecat/evil/{hostile}"
        await pt.submit(
            hostile,
            branch1,
            push(pt.origin, branch1, {"check.sh": f"setsid -f sh -c '{KILLER}' </dev/null >/dev/null 2>&1\nexit 1\n"}),
        )
        for n in range(3):
            bead = await pt.new_bead(f"Honest {n}", prefix="demo")
            branch = f"polecat/ann/{bead}"
            await pt.submit(bead, branch, push(pt.origin, branch, {f"f{n}.txt": "fine\n"}))

        def paused() -> str:
            assert pt.refinery is not None
            queue = pt.refinery.projection.state.queues.get("demo")
            assert queue is not None, "no queue record (yet)"
            assert queue.paused, "not paused (yet)"
            return queue.reason

        try:
            reason = await assert_eventually(paused, timeout=60, interval=0.2)
        except AssertionError:
            return  # held: the queue was not paused
        raise AssertionError(f"one hostile change paused the rig's merge queue for every change: {reason}")
