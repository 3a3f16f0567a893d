"""Crew workspaces (issue 43, docs/crew.md) in a real town: nats-server, the services, real tmux and git.

A person: `gt crew add`, `gt crew attach` (run in a terminal of its own, a tmux pane on another server), a commit
and `gt done` typed into the shell it opens: the branch merges, twice on the same branch. `gt crew remove` is refused
while the workspace holds uncommitted work, then removes it. A bead hooked to a crew member (`gt sling --crew`) is
worked in its workspace by the rig's agent, killed -9 mid-molecule and resumed at its step by a fresh session there;
it merges, and the member and its workspace outlive the sessions and a witness restart."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from services.witness.settings import WitnessSettings
from shared.core.config import TownConfig
from shared.host import git
from tests.helpers import assert_eventually, gt_run
from tests.integration.test_witness import STEPS, step_done_counts
from tests.witness_town import PolecatTown, polecat_town

SETTINGS = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0)


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    async with polecat_town(town, nc, tmp_path, SETTINGS) as handle:
        yield handle


@pytest.fixture
def env(pt: PolecatTown, gt_env: dict[str, str]) -> dict[str, str]:
    path = f"{Path(sys.executable).parent}:{gt_env.get('PATH', '/usr/bin:/bin')}"  # `gt` in the person's shell
    town = {"NATS_URL": pt.config.nats_url, "GT_HOME": str(pt.config.gt_home), "GT_TMUX_SOCKET": pt.socket}
    return {**gt_env, **town, "PATH": path}


@pytest.fixture
def terminal() -> Iterator[str]:
    """A person's terminal: a tmux server of its own (not the town's), to run `gt crew attach` in."""
    socket = f"person-{uuid.uuid4().hex[:8]}"
    yield socket
    subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)


def gt_ok(env: dict[str, str], *args: str) -> str:
    out = gt_run(env, *args)
    assert out.returncode == 0, (args, out.stdout, out.stderr)
    return out.stdout


async def crew_list(env: dict[str, str], rig: str = "demo") -> list[dict[str, Any]]:
    """`gt crew list RIG --json` (in a thread: the services answering it run in this loop)."""
    listed: list[dict[str, Any]] = json.loads(await asyncio.to_thread(gt_ok, env, "crew", "list", rig, "--json"))
    return listed


async def added(env: dict[str, str], name: str) -> dict[str, Any]:
    """`gt crew add demo NAME`, and its workspace made."""
    out = await asyncio.to_thread(gt_ok, env, "crew", "add", "demo", name)
    assert f"crew demo/{name}: added on crew/{name}" in out, out

    async def ready() -> dict[str, Any]:
        [crew] = [c for c in await crew_list(env) if c["name"] == name]
        assert crew["ready"], crew
        return crew

    crew: dict[str, Any] = await assert_eventually(ready, timeout=60)
    return crew


def screen(socket: str) -> str:
    return subprocess.run(
        ["tmux", "-L", socket, "capture-pane", "-p", "-J", "-S", "-200", "-t", "me"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout


def type_line(socket: str, line: str) -> None:
    subprocess.run(["tmux", "-L", socket, "send-keys", "-t", "me", "-l", line], check=True)
    subprocess.run(["tmux", "-L", socket, "send-keys", "-t", "me", "Enter"], check=True)


async def typed(socket: str, line: str, until: str, timeout: float = 120) -> str:
    """Type ``line`` into the person's terminal (attached to the crew shell) and wait for ``until`` (a regular
    expression) on it."""
    type_line(socket, line)

    def shown() -> str:
        text = screen(socket)
        assert re.search(until, text), text[-1500:]
        return text

    found: str = await assert_eventually(shown, timeout=timeout, interval=0.2)
    return found


def origin_files(pt: PolecatTown) -> list[str]:
    return git.git("ls-tree", "--name-only", "main", cwd=pt.origin).split()


async def test_a_person_attaches_commits_and_gt_done_merges_the_crew_branch_then_removes_it_cleanly(
    pt: PolecatTown, env: dict[str, str], terminal: str
) -> None:
    await pt.add_rig()
    crew = await added(env, "ann")
    workspace = Path(crew["workspace"])
    assert workspace == pt.config.gt_home / "rigs" / "demo" / "crew" / "ann"
    assert git.git("rev-parse", "--abbrev-ref", "HEAD", cwd=workspace).strip() == "crew/ann"
    attach = shlex.join(["env", *(f"{k}={v}" for k, v in env.items() if k != "TMUX"), *gt_cmd("crew", "attach")])
    terminal_size = ["-x", "200", "-y", "50"]
    subprocess.run(["tmux", "-L", terminal, "new-session", "-d", "-s", "me", *terminal_size, attach], check=True)
    await typed(terminal, "pwd; echo CREW=$GT_CREW", "CREW=demo/ann")
    assert str(workspace) in screen(terminal)
    await typed(terminal, "gt prime", "Crew member demo/ann: workspace .* on crew/ann")

    identity = "git -c user.name=Ann -c user.email=ann@example.com"
    for n in (1, 2):  # twice on the same branch: the second carries the first, merged already
        await typed(
            terminal,
            f"echo {n} > ann{n}.txt && git add ann{n}.txt && {identity} commit -qm 'Add ann{n}' && gt done; echo rc=$?",
            r"rc=\d",
        )
        text = screen(terminal)
        assert "done: crew/ann published at" in text, text[-2000:]
        assert "rc=0" in text, text[-2000:]

        def merged(n: int = n) -> bool:
            assert f"ann{n}.txt" in origin_files(pt), origin_files(pt)
            return True

        await assert_eventually(merged, timeout=120)
        subprocess.run(["tmux", "-L", terminal, "send-keys", "-t", "me", "clear", "Enter"], check=True)

    def both_closed() -> bool:
        assert pt.mayor is not None
        beads = [b for b in pt.mayor.projection.state.beads.values() if b.title.startswith("crew/ann: ")]
        assert sorted(b.title for b in beads) == ["crew/ann: Add ann1", "crew/ann: Add ann2"]
        assert all(b.status == "closed" for b in beads), [(b.id, b.status) for b in beads]
        return True

    await assert_eventually(both_closed, timeout=60)

    (workspace / "scratch.txt").write_text("not committed\n")
    refused = await asyncio.to_thread(gt_run, env, "crew", "remove", "demo", "ann")
    assert refused.returncode != 0
    assert "uncommitted changes" in refused.stdout + refused.stderr, (refused.stdout, refused.stderr)
    assert workspace.is_dir()
    assert [c["status"] for c in await crew_list(env)] == ["added"]
    (workspace / "scratch.txt").unlink()
    out = await asyncio.to_thread(gt_ok, env, "crew", "remove", "demo", "ann")
    assert "crew demo/ann: removed" in out
    shell = subprocess.run(["tmux", "-L", pt.socket, "has-session", "-t", "=gtcrew-demo-ann"], check=False)
    assert shell.returncode != 0, "its shell is ended with it"

    async def gone() -> bool:
        assert not workspace.exists()
        assert await crew_list(env) == []
        return True

    emptied: bool = await assert_eventually(gone, timeout=60)
    assert emptied
    assert sorted(f for f in origin_files(pt) if f.startswith("ann")) == ["ann1.txt", "ann2.txt"]
    anew = await added(env, "ann")  # its name is free: a member anew, from main as it is now
    assert (Path(anew["workspace"]) / "ann2.txt").is_file()


def gt_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gt.cli.main", *args, "demo", "ann"]


async def test_a_bead_hooked_to_a_crew_member_is_worked_in_its_workspace_resumed_after_a_kill_and_kept(
    pt: PolecatTown, env: dict[str, str]
) -> None:
    # The first session is killed (-9, by itself) after committing step 3, before `gt step done`.
    await pt.add_rig(agent_command="GT_AGENT_FAULT=crash-at-step=3@1 gt-agent")
    crew = await added(env, "joe")
    bead = await pt.new_bead("Crew work")
    out = await asyncio.to_thread(gt_ok, env, "sling", bead, "demo", "--crew", "joe")
    assert f"bead {bead} hooked" in out, out
    assert f"{bead}: hooked on demo" in out, out
    await pt.wait_merge_requested(bead)
    sessions = await pt.wait_settled(bead)
    assert [s.end_reason for s in sessions] == ["zombie", "done"], pt.endings(sessions)
    assert {(s.polecat, s.worktree, s.branch) for s in sessions} == {("joe", crew["workspace"], "crew/joe")}
    assert [s.tmux_name for s in sessions] == ["gt-demo-joe", "gt-demo-joe"]
    assert [s.steps_done for s in sessions] == [2, 4], "the fresh session began at the step the first died in"
    assert await step_done_counts(pt, bead) == dict.fromkeys(STEPS, 1), "each step done exactly once"

    def closed() -> bool:
        assert pt.mayor is not None
        assert pt.mayor.projection.state.beads[bead].status == "closed"
        return True

    await assert_eventually(closed, timeout=120)
    workspace = Path(crew["workspace"])
    assert workspace.is_dir(), "the member's workspace outlives its sessions"
    assert git.git("rev-parse", "--abbrev-ref", "HEAD", cwd=workspace).strip() == "crew/joe"
    assert all(s.cleaned and not s.worktree_removed for s in pt.sessions_of(bead))

    await pt.stop("witness")  # a witness restart: the member is in the log, its workspace on disk
    await pt.start_witness(SETTINGS)
    [listed] = await crew_list(env)
    assert (listed["name"], listed["ready"], listed["hooked"]) == ("joe", True, bead)
    out = await asyncio.to_thread(gt_ok, env, "crew", "remove", "demo", "joe")
    assert "removed" in out

    def removed() -> bool:
        assert not workspace.exists()
        return True

    await assert_eventually(removed, timeout=60)
