"""A polecat's workspace is kept for its next bead and moved there by what changed (issue 41): never does it carry
a previous bead's files, git state or processes, whatever that bead's agent did to it from its pane.

Bead 1's agent (a real pane, the session's exact environment) is hostile before it does its work: it changes a
tracked file and hides the change from git (``--skip-worktree``: git status is clean, `gt done` lets it through, a
plain ``checkout --force`` leaves it), leaves an ignored file (one it lists in ``.git/info/exclude`` itself, and one
git's build-output list ignores), points ``core.hooksPath`` at its own hooks, and starts a process in a session of
its own. Bead 2, slung to the same polecat once bead 1 merged, must find its commit's files exactly, a repository
of the witness's making, and none of those processes. In the laptop town, in a town whose agents run as their own
OS user, and in the compose stack (in containers, agents as the image's user ``agent``), where bead 1's agent also
turns a tracked directory into a link, as the red team did.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import pwd
import secrets
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from services.witness.state import Session
from shared.host import git, repository_renewal
from tests.compose_stack import USERS, ComposeStack, Operator, run_where_agents_run, running_stack
from tests.conftest import REPO_ROOT
from tests.helpers import assert_eventually, running_with, wait_until
from tests.integration.test_agent_attacks import AGENT_UID, gt_status
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


def hostile(hooks: Path, mark: str = MARK) -> str:
    """What bead 1's agent does to its workspace before its work (``hooks``: a directory of hooks of its own;
    ``mark``: its lurker's sleep)."""
    return (
        "echo tampered >> README.md && git update-index --skip-worktree README.md"
        " && echo SECRET_LEFT >> .git/info/exclude && echo secret > SECRET_LEFT"
        " && mkdir -p node_modules && echo 'module.exports = 1' > node_modules/poison.js"
        f" && git config core.hooksPath {hooks}"
        f" && (setsid sleep {mark} </dev/null >/dev/null 2>&1 &)"
    )


HONEST = "echo one > ONE.txt && git add ONE.txt && git commit -qm one && gt done"
"""Bead 1's work, once it left its things behind."""


def agent_command(marker: Path, hooks: Path) -> str:
    # The first session is hostile, then does its work; the next one waits (the test looks at its workspace).
    first = f"{hostile(hooks)} && touch {marker}/attacked; exec gt-agent"
    return f"if mkdir {marker} 2>/dev/null; then {first}; else GT_AGENT_FAULT=hang exec gt-agent; fi"


def lurkers() -> list[str]:
    found = subprocess.run(["pgrep", "-f", f"^sleep {MARK}$"], capture_output=True, text=True)
    return found.stdout.split()


async def merged(pt: PolecatTown, bead: str) -> None:
    def closed() -> bool:
        assert pt.mayor is not None
        return pt.mayor.projection.state.beads[bead].status == "closed"

    await assert_eventually(closed, timeout=120)


async def next_bead_started(pt: PolecatTown) -> Session:
    """A second bead slung to the rig's one polecat, once its session started: that session."""
    second = await pt.new_bead("The next bead on the same polecat")
    await pt.sling(second)

    def started() -> Session:
        sessions = pt.sessions_of(second)
        assert sessions, "no session yet"
        assert sessions[0].status == "started", sessions[0].status
        return sessions[0]

    session: Session = await assert_eventually(started, timeout=90)
    return session


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
    assert (tmp_path / "first-ran" / "attacked").exists(), "bead 1's agent did all of it"

    await merged(pt, first)

    def settled() -> bool:
        return git.workspace_branch(workspace) is None and not (workspace / "SECRET_LEFT").exists()

    # Its agents are the witness's own user: the released workspace is settled at once (the full pass, detached
    # at the base), and the next start moves it by the change.
    await assert_eventually(settled, timeout=60)
    mark = workspace.parent.parent / "workspaces" / f"{session.polecat}.settled"  # the witness's record of it
    await assert_eventually(mark.exists, timeout=60)
    repository = os.stat(workspace / ".git").st_ino
    again = await next_bead_started(pt)
    assert again.worktree == session.worktree, "the same polecat, the same workspace"
    assert os.stat(workspace).st_ino == inode, "recycled in place, not made again"
    assert os.stat(workspace / ".git").st_ino == repository, "moved by the change: the settled repository kept"
    assert not mark.exists(), "the start took the record"
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


def outliving_writer(marker: Path, mark: str) -> str:
    """Bead 1's agent: a writer detached from its session (``setsid``, deaf to SIGTERM and SIGHUP) that appends to
    an ignored file in the workspace for ever (its name carries ``mark``); its work and `gt done`; then it kills its
    pane's reaper (a laptop's agent can: the same OS user), so the writer outlives the session. Later beads hang."""
    writer = (
        f"trap '' TERM HUP INT; while :; do mkdir -p node_modules; echo {mark} >>node_modules/LEFT; sleep 0.2; done"
    )
    # ``[r]eaper``: the pattern must not match this shell's own command line, which holds it.
    kill_reaper = (
        "pid=$$; while [ \"$pid\" -gt 1 ]; do if tr '\\0' ' ' < /proc/$pid/cmdline | grep -q '[r]eaper\\.py'; then"
        " kill -9 $pid; break; fi; pid=$(awk '{print $4}' /proc/$pid/stat); done"
    )
    first = f"(setsid sh -c {shlex.quote(writer)} </dev/null >/dev/null 2>&1 &); {HONEST}; {kill_reaper}; sleep 600"
    return f"if mkdir {marker} 2>/dev/null; then {first}; else GT_AGENT_FAULT=hang exec gt-agent; fi"


def writers(mark: str) -> list[str]:
    """The writer's processes (not the tmux server's or a reaper's, whose command lines hold the agent's command)."""
    return [line for line in running_with(f"echo {mark}") if "tmux" not in line and "reaper.py" not in line]


async def test_a_workspace_whose_session_left_a_process_is_not_settled_and_its_next_start_takes_the_whole_way(
    pt: PolecatTown, tmp_path: Path
) -> None:
    """Settling a released workspace at once, and moving it by the change at the next start, trusts that nothing
    wrote in it between the two: a process of the ended session that outlived it (its agent killed its reaper)
    would. So the settle is skipped while one runs; the next start stops it, then takes the whole way, and the
    next bead finds nothing it wrote."""
    mark = f"gt-left-{secrets.token_hex(4)}"
    await pt.add_rig(agent_command=outliving_writer(tmp_path / "first-ran", mark), max_polecats=1)
    first = await pt.new_bead("Work, and leave a writer behind")
    await pt.sling(first)
    [ended] = await pt.wait_settled(first, timeout=120)
    assert ended.worktree_removed, "released: the writer's file is ignored, the work published"
    workspace = Path(ended.worktree)
    assert writers(mark), "the writer outlived its session (the attack ran)"
    await asyncio.sleep(2)  # an absence: a settle would have begun by now (it follows session.cleaned at once)
    assert not (workspace.parent.parent / "workspaces" / f"{ended.polecat}.settled").exists(), "not settled"
    assert git.workspace_branch(workspace) == ended.branch, "left as released"
    repository = os.stat(workspace / ".git").st_ino

    await merged(pt, first)
    again = await next_bead_started(pt)
    assert again.worktree == ended.worktree
    assert not writers(mark), "the start stopped the writer first"
    assert os.stat(workspace / ".git").st_ino != repository, "the whole way: its repository made anew"
    for _ in range(5):  # and nothing written since (the writer wrote every 0.2 s while it lived)
        assert not (workspace / "node_modules").exists()
        await asyncio.sleep(0.3)
    assert git.status_paths(workspace) == []
    assert git.workspace_branch(workspace) == again.branch


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
    first_run = f"if mkdir {readable / 'first-ran'} 2>/dev/null; then {hostile(hooks)}; {HONEST}; else sleep 3600; fi"
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


LINKED = (
    "mkdir build && mv lib build/lib && ln -s build/lib lib && git update-index --assume-unchanged lib/a.py"
    " && printf 'build/\\nlib\\n' >> .git/info/exclude"
)
"""The red team's link (issue 41): the tracked directory ``lib`` moved into an ignored one the agent made, a link
to it left in its place, git told to look away (git status stays clean: the workspace is released)."""
LIB_FILE = "print(1)\n"
STACK_DEADLINE_S = 300.0


def lurker_scan(mark: str) -> str:
    """A shell script listing the pids whose whole command line is ``sleep <mark>`` (the image has no pgrep): not
    the panes' shells, whose command lines hold the lurker's text amid the rest."""
    return (
        f"for p in /proc/[0-9]*; do tr '\\0' ' ' 2>/dev/null < $p/cmdline | grep -qx 'sleep {mark} '"
        " && echo ${p#/proc/}; done; true"
    )


@pytest.mark.compose_stack
@pytest.mark.timeout(1200)
def test_in_the_compose_stack_a_recycled_workspace_carries_nothing_of_a_hostile_earlier_bead(
    gt_env: dict[str, str], tmp_path: Path
) -> None:
    """The same attack from a real pane in the multi-user stack (in containers under podman when it is ready, else
    as local processes): bead 1's agent, the image's user ``agent``, leaves its things behind and a link where a
    tracked directory was, then works; bead 2 on the same polecat gets the same directory holding its commit's files
    exactly, every file the agent user's, a repository of the witness's making, and no process of bead 1's."""
    passwords = {user: secrets.token_hex(12) for user in USERS}
    # Its own lurker mark: as local processes the scan sees the whole host, where the laptop variant may run.
    mark = str(10_000 + secrets.randbelow(80_000))
    with running_stack(REPO_ROOT, tmp_path / "stack", gt_env, passwords) as stack:
        gt = Operator(stack, gt_env, tmp_path / "operator-home")
        in_containers = isinstance(stack, ComposeStack)
        where = Path("/var/lib/gastown/recycle") if in_containers else tmp_path / "recycle"

        run_there = functools.partial(run_where_agents_run, stack)

        def in_workspace(path: str, script: str) -> str:
            # Root's git in the agent's repository: no index refresh written (it would become root's).
            return run_there("sh", "-c", f"cd {shlex.quote(path)} && export GIT_OPTIONAL_LOCKS=0 && {script}")

        def lurkers() -> list[str]:
            return run_there("sh", "-c", lurker_scan(mark)).split()

        # A folder of the agents' user: the first agent's marker, its hooks, the go-ahead the test gives it.
        hooks, first_ran, go = where / "hooks", where / "first-ran", where / "go"
        run_there("mkdir", "-p", str(hooks))
        if in_containers:
            run_there("chown", "-R", f"{AGENT_UID}:{AGENT_UID}", str(where))
        origin = stack.make_origin()
        # A tracked directory for the agent to turn into a link (the stack's origin holds a README alone).
        seed = f"/tmp/seed-{secrets.token_hex(4)}"
        run_there(
            "sh",
            "-c",
            f"set -e; git clone -q {origin} {seed} && cd {seed} && mkdir lib && printf 'print(1)\\n' > lib/a.py"
            " && git add lib && git -c user.name=t -c user.email=t@t commit -qm lib && git push -q origin main"
            f" && rm -rf {seed}",
            user="gastown" if in_containers else None,
        )
        readme = run_there("git", "--git-dir", origin, "show", "main:README.md")
        # The first session is hostile, waits until the test saw its lurker, then works; the next one waits.
        q = shlex.quote
        command = (
            f"if mkdir {q(str(first_ran))} 2>/dev/null; then {LINKED} && {hostile(hooks, mark)}"
            f" && while [ ! -e {q(str(go))} ]; do sleep 0.2; done; {HONEST}; else sleep 3600; fi"
        )
        gt("rig", "add", "demo", origin, "--agent", command, "--max-polecats", "1")
        first = gt("bead", "create", "Work, after leaving things behind")
        gt("sling", first, "demo")

        def sessions_of(bead: str) -> list[dict[str, Any]]:
            listed: list[dict[str, Any]] = json.loads(gt("session", "list", "--all", "--json"))
            return [s for s in listed if s["bead"] == bead]

        def diagnose() -> None:
            print(gt("session", "list", "--all"))
            print(stack.log_tail("witness", 80))

        try:
            wait_until(lurkers, timeout=STACK_DEADLINE_S, message="bead 1's agent left its things and its lurker")
        except AssertionError:
            diagnose()
            raise
        [session] = sessions_of(first)
        workspace = str(session["worktree"])
        # What bead 1's agent left is there before it works (as local processes, agents are the witness's own user:
        # its released workspace is settled at once, so this is looked at now): each check below has something to
        # find.
        left = in_workspace(
            workspace,
            "test -L lib && test -e SECRET_LEFT && test -e node_modules/poison.js && grep -q tampered README.md"
            " && git config core.hooksPath && git ls-files -v README.md lib/a.py",
        )
        assert left.split() == [str(hooks), "S", "README.md", "h", "lib/a.py"], left
        try:
            run_there("touch", str(go))
            wait_until(lambda: gt_status(gt, first) == "closed", timeout=STACK_DEADLINE_S, message="bead 1 merged")
            wait_until(
                lambda: any(s["cleaned"] and s["worktree_removed"] for s in sessions_of(first)),
                timeout=STACK_DEADLINE_S,
                message="bead 1's workspace released",
            )
        except AssertionError:
            diagnose()
            raise
        [ended] = sessions_of(first)
        assert ended["end_reason"] == "done", ended
        assert str(ended["worktree"]) == workspace
        inode = run_there("stat", "-c", "%i", workspace).strip()
        second = gt("bead", "create", "The next bead on the same polecat")
        gt("sling", second, "demo")
        try:
            wait_until(
                lambda: any(s["status"] == "started" for s in sessions_of(second)),
                timeout=STACK_DEADLINE_S,
                message="bead 2's session started",
            )
        except AssertionError:
            diagnose()
            raise
        [again] = sessions_of(second)
        assert again["worktree"] == workspace, "the same polecat, the same workspace"
        assert run_there("stat", "-c", "%i", workspace).strip() == inode, "recycled in place, not made again"
        assert run_there("git", "--git-dir", origin, "show", "main:README.md") == readme, "bead 1 merged no tampering"
        on_disk = in_workspace(workspace, "find . -path ./.git -prune -o ! -type d -print | cut -c3- | sort")
        tracked = in_workspace(workspace, "git ls-tree -r --name-only HEAD | sort")
        assert on_disk == tracked, "its commit's files, nothing left beside them (SECRET_LEFT, node_modules, build)"
        assert "ONE.txt" in tracked.split(), "bead 1's merged work is on the new branch's base"
        assert in_workspace(workspace, "cat README.md") == readme, "the change git was told to skip is undone"
        assert in_workspace(workspace, "test -d lib && test ! -L lib && cat lib/a.py") == LIB_FILE, "a directory again"
        config = in_workspace(workspace, "cat .git/config")
        assert str(hooks) not in config, f"its config is the witness's: {config}"
        exclude = in_workspace(workspace, "cat .git/info/exclude").split("\n")
        assert not {"SECRET_LEFT", "build/", "lib"} & set(exclude), exclude
        flags = in_workspace(workspace, "git ls-files -v").split("\n")
        assert not [line for line in flags if line[:1] in ("S", "h")], f"no entry is skipped or assumed: {flags}"
        status = in_workspace(workspace, "git status --porcelain --ignored --untracked-files=all")
        assert status == "", status
        assert in_workspace(workspace, "git symbolic-ref --short HEAD").strip() == again["branch"]
        if in_containers:
            # Every file of it, its repository too, is the agent user's: none root's, the witness's or gastown's.
            others = run_there("find", workspace, "!", "-uid", str(AGENT_UID))
            assert others == "", f"not the agent user's: {others}"
        assert lurkers() == [], "bead 1's detached process ended with its session"


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


EXCLUDES = git.BUILD_OUTPUT
"""What the witness lists in every workspace's ``info/exclude``."""


def _commit_all(src: Path, message: str) -> str:
    git.git("add", "-A", cwd=src)
    git.git("-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit", "--quiet", "-m", message, cwd=src)
    return git.git("rev-parse", "HEAD", cwd=src).strip()


def _released_hostile_workspace(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """A rig's clone and a polecat's workspace on it whose bead's agent left what the hostile agent above leaves
    (a tracked change hidden from git, an excluded file, an ignored directory, its own hooks), released; with the
    source repository the clone fetches from, and the witness's scratch folder."""
    src = tmp_path / "src"
    git.git("init", "--quiet", "-b", "main", str(src))
    for name in ("keep.txt", "change.txt", "gone.txt"):
        (src / name).write_text(f"{name} one\n")
    (src / "lib").mkdir()
    (src / "lib" / "a.py").write_text("print(1)\n")
    _commit_all(src, "c1")
    bare = tmp_path / "repo.git"
    git.git("clone", "--quiet", "--bare", "--", str(src), str(bare))
    git.git("config", "remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*", cwd=bare)
    git.fetch(bare)
    path, scratch = tmp_path / "polecats" / "ace", tmp_path / "workspaces"
    scratch.mkdir()
    assert git.ensure_worktree(bare, path, "polecat/ace/b1", "main", origin=str(src), excludes=EXCLUDES)
    (scratch / "ace.index").write_bytes(repository_renewal.read_index(path))

    (path / "keep.txt").write_text("tampered\n")
    git.git("update-index", "--skip-worktree", "keep.txt", cwd=path)
    with (path / ".git" / "info" / "exclude").open("a") as exclude:
        exclude.write("SECRET_LEFT\n")
    (path / "SECRET_LEFT").write_text("secret\n")
    (path / "node_modules").mkdir()
    (path / "node_modules" / "poison.js").write_text("module.exports = 1\n")
    git.git("config", "core.hooksPath", str(tmp_path / "hooks"), cwd=path)
    assert git.status_paths(path) == [], "git sees nothing changed: the workspace is released"
    assert git.release_worktree(bare, path, "main").startswith("worktree released")
    return src, bare, path, scratch


def _exactly_at(path: Path, commit: str, branch: str) -> None:
    """The workspace holds ``commit``'s files and nothing else, its index is that tree with no flag set, and it is on
    ``branch``."""
    assert git.workspace_branch(path) == branch
    assert git.git("rev-parse", "HEAD", cwd=path).strip() == commit
    tree = git.git("ls-tree", "-r", "--format=%(objectmode) %(objectname) %(path)", commit, cwd=path).splitlines()
    staged = git.git("ls-files", "--format=%(objectmode) %(objectname) %(path)", cwd=path).splitlines()
    assert staged == tree
    flags = git.git("ls-files", "-v", cwd=path).splitlines()
    assert not [line for line in flags if line[:1] in ("S", "h")], flags
    listed = git.git("status", "--porcelain", "--ignored", "--untracked-files=all", cwd=path)
    assert listed == "", listed
    files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if ".git" not in p.relative_to(path).parts)
    assert files == sorted({line.split(" ", 2)[2] for line in tree} | {"lib"}), files
    for line in tree:
        name = line.split(" ", 2)[2]
        blob = git.git("cat-file", "blob", f"{commit}:{name}", cwd=path)
        assert (path / name).read_text() == blob, name


def test_a_released_workspace_is_settled_at_once_and_moved_by_the_change_at_the_next_start(tmp_path: Path) -> None:
    """Where agents are the witness's own user, the witness settles a released workspace right away (the full pass:
    a repository made anew with its trusted index, checked out, cleaned), so the next start only moves it by what
    changed on the base since: a file changed, one added, one removed. Nothing of the earlier bead's is left, and
    the repository the start finds is the one the settle made (not made again)."""
    src, bare, path, scratch = _released_hostile_workspace(tmp_path)
    c1 = git.resolve_commit(bare, "refs/remotes/origin/main")
    recycle = git.Recycle(trusted_index=scratch / "ace.index", scratch=scratch, owner=None)
    settled = git.settle_released(bare, path, "main", origin=str(src), excludes=EXCLUDES, recycle=recycle)
    assert settled is not None
    assert settled.commit == c1
    assert not (path / "SECRET_LEFT").exists()
    assert not (path / "node_modules").exists()
    assert (path / "keep.txt").read_text() == "keep.txt one\n", "the change git was told to skip is undone"
    assert "hooksPath" not in (path / ".git" / "config").read_text()
    repository = os.stat(path / ".git").st_ino
    (scratch / "ace.index").write_bytes(repository_renewal.read_index(path))

    (src / "change.txt").write_text("change.txt two\n")
    (src / "new.txt").write_text("new\n")
    (src / "gone.txt").unlink()
    c2 = _commit_all(src, "c2")
    git.fetch(bare)
    again = recycle._replace(settled=settled)
    assert git.ensure_worktree(bare, path, "polecat/ace/b2", "main", origin=str(src), excludes=EXCLUDES, recycle=again)
    assert os.stat(path / ".git").st_ino == repository, "moved by the change: the settled repository kept"
    _exactly_at(path, c2, "polecat/ace/b2")
    assert git.resolve_commit(path, "refs/remotes/origin/main") == c2


def test_a_settled_workspace_whose_base_did_not_move_is_taken_by_its_refs_alone(tmp_path: Path) -> None:
    """The common case in a busy town (the release fetched, nothing merged since): the start finds the settled
    workspace at the very commit it wants; nothing is checked out, only the branch made and HEAD pointed at it."""
    src, bare, path, scratch = _released_hostile_workspace(tmp_path)
    c1 = git.resolve_commit(bare, "refs/remotes/origin/main")
    recycle = git.Recycle(trusted_index=scratch / "ace.index", scratch=scratch, owner=None)
    settled = git.settle_released(bare, path, "main", origin=str(src), excludes=EXCLUDES, recycle=recycle)
    assert settled is not None
    repository = os.stat(path / ".git").st_ino
    index = os.stat(path / ".git" / "index").st_mtime_ns
    again = recycle._replace(settled=settled)
    assert git.ensure_worktree(bare, path, "polecat/ace/b2", "main", origin=str(src), excludes=EXCLUDES, recycle=again)
    assert os.stat(path / ".git").st_ino == repository, "the settled repository kept"
    assert os.stat(path / ".git" / "index").st_mtime_ns == index, "no checkout: the index as the settle wrote it"
    _exactly_at(path, c1, "polecat/ace/b2")
    assert git.resolve_commit(path, "refs/remotes/origin/main") == c1


def test_a_settled_workspace_that_git_ran_in_since_takes_the_whole_way(tmp_path: Path) -> None:
    """A git run in the settled workspace since (a person, another witness) wrote its index: the mark no longer
    matches, and the start makes the repository anew and takes the full pass, which undoes what was done there."""
    src, bare, path, scratch = _released_hostile_workspace(tmp_path)
    recycle = git.Recycle(trusted_index=scratch / "ace.index", scratch=scratch, owner=None)
    settled = git.settle_released(bare, path, "main", origin=str(src), excludes=EXCLUDES, recycle=recycle)
    assert settled is not None
    repository = os.stat(path / ".git").st_ino
    (scratch / "ace.index").write_bytes(repository_renewal.read_index(path))
    (path / "keep.txt").write_text("changed after the settle\n")
    git.git("update-index", "--skip-worktree", "keep.txt", cwd=path)  # writes the index
    (path / "LATE").write_text("late\n")

    c1 = git.resolve_commit(bare, "refs/remotes/origin/main")
    again = recycle._replace(settled=settled)
    assert git.ensure_worktree(bare, path, "polecat/ace/b2", "main", origin=str(src), excludes=EXCLUDES, recycle=again)
    assert os.stat(path / ".git").st_ino != repository, "its repository made anew"
    _exactly_at(path, c1, "polecat/ace/b2")


def test_a_start_asking_for_another_origin_or_excludes_than_the_settle_takes_the_whole_way(tmp_path: Path) -> None:
    """The settle made the repository with the rig's origin and excludes of that moment: a start asking for others
    (the rig's repository moved, a newer version's excludes) makes it anew rather than keep the old config."""
    src, bare, path, scratch = _released_hostile_workspace(tmp_path)
    recycle = git.Recycle(trusted_index=scratch / "ace.index", scratch=scratch, owner=None)
    settled = git.settle_released(bare, path, "main", origin=str(src), excludes=EXCLUDES, recycle=recycle)
    assert settled is not None
    repository = os.stat(path / ".git").st_ino
    (scratch / "ace.index").write_bytes(repository_renewal.read_index(path))
    moved = tmp_path / "moved-origin"
    src.rename(moved)
    again = recycle._replace(settled=settled)
    assert git.ensure_worktree(
        bare, path, "polecat/ace/b2", "main", origin=str(moved), excludes=EXCLUDES, recycle=again
    )
    assert os.stat(path / ".git").st_ino != repository, "the whole way: its repository made anew"
    assert git.git("config", "--get", "remote.origin.url", cwd=path).strip() == str(moved)
    _exactly_at(path, settled.commit, "polecat/ace/b2")
