"""A polecat's workspace is kept for its next bead and moved there by what changed (issue 41): never does it carry
a previous bead's files, git state or processes, whatever that bead's agent did to it from its pane.

Bead 1's agent (a real pane, the session's exact environment) is hostile before it does its work: it changes a
tracked file and hides the change from git (``--skip-worktree``: git status is clean, `gt done` lets it through, a
plain ``checkout --force`` leaves it), leaves an ignored file (one it lists in ``.git/info/exclude`` itself, and one
git's build-output list ignores), points ``core.hooksPath`` at its own hooks, and starts a process in a session of
its own. Bead 2, slung to the same polecat once bead 1 merged, must find its commit's files exactly, a repository
of the witness's making, and none of those processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import secrets
import subprocess
from pathlib import Path

from shared.host import git, repository_renewal
from tests.helpers import assert_eventually, wait_until
from tests.integration.test_agent_user import (
    DEADLINE_S,
    agent_user,  # noqa: F401 - the throwaway agent user fixture
)
from tests.integration.test_town import TownCli
from tests.os_users import user_bin_dir
from tests.witness_town import PolecatTown, make_origin

README = "a project the polecats work on\n"
MARK = "4731"
"""The lurker's sleep: found by its command line."""


HOSTILE = (
    "echo tampered >> README.md && git update-index --skip-worktree README.md"
    " && echo SECRET_LEFT >> .git/info/exclude && echo secret > SECRET_LEFT"
    " && mkdir -p node_modules && echo 'module.exports = 1' > node_modules/poison.js"
    " && git config core.hooksPath {hooks}"
    f" && (setsid sleep {MARK} </dev/null >/dev/null 2>&1 &)"
)
"""What bead 1's agent does to its workspace before its work (``{hooks}``: a directory of hooks of its own)."""


def agent_command(marker: Path, hooks: Path) -> str:
    # The first session is hostile, then does its work; the next one waits (the test looks at its workspace).
    hostile = HOSTILE.format(hooks=hooks)
    return f"if mkdir {marker} 2>/dev/null; then {hostile}; exec gt-agent; else GT_AGENT_FAULT=hang exec gt-agent; fi"


def lurkers() -> list[str]:
    found = subprocess.run(["pgrep", "-f", f"^sleep {MARK}$"], capture_output=True, text=True)
    return found.stdout.split()


async def test_a_recycled_workspace_carries_nothing_of_a_hostile_earlier_bead(pt: PolecatTown, tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    await pt.add_rig(agent_command=agent_command(tmp_path / "first-ran", hooks), max_polecats=1)
    first = await pt.new_bead("Work, after leaving things behind")
    await pt.sling(first)
    await pt.wait_merge_requested(first)
    session = pt.sessions_of(first)[0]
    workspace = Path(session.worktree)
    inode = (await asyncio.to_thread(os.stat, workspace)).st_ino
    [ended] = await pt.wait_settled(first, timeout=120)
    assert ended.end_reason == "done"
    assert ended.worktree_removed, "released: the polecat's name is free again"
    assert (workspace / "SECRET_LEFT").exists(), "bead 1's agent did leave it (the attack ran)"

    def closed() -> bool:
        assert pt.mayor is not None
        return pt.mayor.projection.state.beads[first].status == "closed"

    await assert_eventually(closed, timeout=120)
    second = await pt.new_bead("The next bead on the same polecat")
    await pt.sling(second)

    def started() -> bool:
        sessions = pt.sessions_of(second)
        return bool(sessions) and sessions[0].status == "started"

    await assert_eventually(started, timeout=60)
    again = pt.sessions_of(second)[0]
    assert again.worktree == session.worktree, "the same polecat, the same workspace"
    assert os.stat(workspace).st_ino == inode, "recycled in place, not made again"
    assert (workspace / "README.md").read_text() == README, "the change git was told to skip is undone"
    assert not (workspace / "SECRET_LEFT").exists()
    assert not (workspace / "node_modules").exists()
    assert "SECRET_LEFT" not in (workspace / ".git" / "info" / "exclude").read_text()
    assert str(hooks) not in (workspace / ".git" / "config").read_text(), "its config is the witness's"
    flags = git.git("ls-files", "-v", cwd=workspace).split("\n")
    assert not [line for line in flags if line[:1] in ("S", "h")], f"no entry is skipped or assumed: {flags}"
    assert git.status_paths(workspace) == []
    assert git.workspace_branch(workspace) == again.branch
    assert not lurkers(), "the earlier agent's detached process ended with its session"


def test_a_recycled_workspace_of_an_agent_user_carries_nothing_of_a_hostile_earlier_bead(
    gt_env: dict[str, str],
    agent_user: tuple[str, Path],  # noqa: F811
) -> None:
    """The same, in a town run by root (`gt up`) whose agents run as their own OS user (``GT_AGENT_USER``), as the
    multi-user stack runs them: the recycled workspace stays the agent user's, its repository made anew by root and
    handed to it, every git in it run as that user."""
    name, readable = agent_user
    entry = pwd.getpwnam(name)
    bin_dir = user_bin_dir(entry.pw_uid, entry.pw_gid, readable)
    hooks = readable / "hooks"
    hooks.mkdir()
    os.chown(readable, entry.pw_uid, entry.pw_gid)  # where the first agent leaves its marker
    socket = f"gt-recycle-{secrets.token_hex(4)}"
    env = {**gt_env, "GT_TMUX_SOCKET": socket, "GT_AGENT_USER": name}
    town = TownCli(env, readable / "town", python=str(bin_dir / "python"))
    honest = "echo one > ONE.txt && git add ONE.txt && git commit -qm one && gt done"
    first_run = (
        f"if mkdir {readable / 'first-ran'} 2>/dev/null; then {HOSTILE.format(hooks=hooks)}; {honest}; "
        "else sleep 3600; fi"
    )
    try:
        up = town("up", "-d", "--port", "0")
        assert up.returncode == 0, up.stderr + up.stdout
        origin = make_origin(readable / "project")
        added = town("rig", "add", "demo", str(origin), "--agent", first_run, "--max-polecats", "1")
        assert added.returncode == 0, added.stderr
        first = town("bead", "create", "Work, after leaving things behind").stdout.strip()
        assert town("sling", first, "demo").returncode == 0
        workspace = town.home / "rigs" / "demo" / "polecats" / "ace"

        def status_of(bead: str) -> str:
            shown = town("bead", "show", bead, "--json")
            return str(json.loads(shown.stdout)["status"]) if shown.returncode == 0 else ""

        wait_until(lambda: status_of(first) == "closed", timeout=DEADLINE_S, message="bead 1 merged")

        def released() -> bool:
            listed = town("session", "list", "--all", "--json")
            return listed.returncode == 0 and any(
                s["bead"] == first and s["cleaned"] and s["worktree_removed"] for s in json.loads(listed.stdout)
            )

        wait_until(released, timeout=DEADLINE_S, message="bead 1's workspace released")
        inode = workspace.stat().st_ino
        second = town("bead", "create", "The next bead on the same polecat").stdout.strip()
        assert town("sling", second, "demo").returncode == 0

        def started() -> bool:
            listed = town("session", "list", "--json")
            return listed.returncode == 0 and any(
                s["bead"] == second and s["status"] == "started" for s in json.loads(listed.stdout)
            )

        try:
            wait_until(started, timeout=DEADLINE_S, message="bead 2's session started")
        except AssertionError:
            print(town("session", "list", "--all").stdout, town("escalations").stdout)
            print((town.home / "logs" / "witness.log").read_text()[-6000:])
            raise
        sessions = json.loads(town("session", "list", "--all", "--json").stdout)
        [again] = [s for s in sessions if s["bead"] == second]
        assert again["worktree"] == str(workspace), sessions
        assert workspace.stat().st_ino == inode, "recycled in place, not made again"
        assert workspace.stat().st_uid == entry.pw_uid
        assert (workspace / ".git").stat().st_uid == entry.pw_uid, "its new repository is the agent user's"
        assert git.git("show", "main:README.md", cwd=origin) == README, "bead 1 merged no tampering"
        assert (workspace / "README.md").read_text() == README
        assert not (workspace / "SECRET_LEFT").exists()
        assert not (workspace / "node_modules").exists()
        assert str(hooks) not in (workspace / ".git" / "config").read_text()
        assert (workspace / "ONE.txt").read_text() == "one\n", "bead 1's merged work is on the new branch's base"
        assert not lurkers()
    finally:
        town("down", "--sessions")
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)


def test_recycling_restores_a_tracked_directory_turned_into_a_link_and_gets_past_a_tree_too_deep_to_walk(
    tmp_path: Path,
) -> None:
    """Found by the red team (issue 41): an agent moves a tracked directory into an ignored one and leaves a link in
    its place (the checkout finds the files unchanged through it, then the clean removes the link and the files go
    with it), and grows a tree too deep to walk inside ``.git`` (it must not stay in the work tree nor stop the
    recycling). The next bead gets every tracked file."""
    src = tmp_path / "src"
    git.git("init", "--quiet", "-b", "main", str(src))
    (src / "lib").mkdir()
    (src / "lib" / "a.py").write_text("print(1)\n")
    (src / ".gitignore").write_text("build/\n")
    git.git("add", "-A", cwd=src)
    git.git("-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit", "--quiet", "-m", "c1", cwd=src)
    bare = tmp_path / "repo.git"
    git.git("clone", "--quiet", "--bare", "--", str(src), str(bare))
    path, scratch = tmp_path / "polecats" / "ace", tmp_path / "workspaces"
    scratch.mkdir()
    assert git.ensure_worktree(bare, path, "polecat/ace/b1", "main")
    trusted = repository_renewal.read_index(path)

    (path / "build").mkdir()
    (path / "lib").rename(path / "build" / "lib")
    (path / "lib").symlink_to("build/lib")
    git.git("update-index", "--assume-unchanged", "lib/a.py", cwd=path)
    with (path / ".git" / "info" / "exclude").open("a") as exclude:
        exclude.write("lib\n")
    fd = os.open(path / ".git", os.O_RDONLY)
    for _ in range(420):
        os.mkdir("d" * 200, dir_fd=fd)
        deeper = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(fd)
    assert git.status_paths(path) == [], "git sees nothing changed: the workspace is released"
    assert git.release_worktree(bare, path, "main").startswith("worktree released")

    recycle = git.Recycle(trusted_index=trusted, scratch=scratch, owner=None)
    assert git.ensure_worktree(bare, path, "polecat/ace/b2", "main", recycle=recycle)
    assert not (path / "lib").is_symlink()
    assert (path / "lib" / "a.py").read_text() == "print(1)\n"
    assert not (path / "build").exists()
    assert git.status_paths(path) == []
    assert git.workspace_branch(path) == "polecat/ace/b2"
    assert {p.name for p in path.iterdir()} == {".git", ".gitignore", "lib"}
