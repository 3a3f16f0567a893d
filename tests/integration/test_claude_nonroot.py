"""A whole town run by a normal (non-root) user, working a bead with the real Claude Code CLI in real tmux against
the scripted model server: ``gt up`` (embedded NATS, mayor, witness, refinery, deacon), the ``gt`` CLI, the
witness's tmux server and the ``claude`` in it are all that user's processes, in a GT_HOME that user owns.

As root the witness gives Claude Code ``IS_SANDBOX=1`` (``--dangerously-skip-permissions`` refuses root without
it); as a normal user it must not, and ``claude`` must still accept the flag. The test needs root to create its
throwaway user (CI runs as root); it fails, never skips, when it is not root.

The project's Python is often not reachable by another user (a pyenv interpreter under root's 0700 home): then
the user runs a virtualenv of a system Python of the same version that adds this one's site-packages (the
project is installed editable there, so it is this checkout's code); when the checkout itself is out of the
user's reach (a 0700 temporary directory), a linked copy of the site-packages and the project's packages.
``claude`` and ``nats-server`` are linked or copied somewhere the user can run them when the checkout is not
reachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gt.model_server import ModelServer, Script, bash, edit, say, use, write
from tests.claude_code import TEST_KEY, claude_binary
from tests.helpers import assert_eventually
from tests.os_users import link_or_copy, remove_user, run_as, user_bin_dir

DEADLINE_S = 180.0
CLI_TIMEOUT_S = 120.0
RIG = "docs"


class TownUser(msgspec.Struct, frozen=True, kw_only=True):
    """A throwaway OS user and everything it runs with: its root dir (GT_HOME, HOME, the origin), its Python's
    bin dir (``gt`` in it), the ``claude`` it can run."""

    name: str
    uid: int
    gid: int
    root: Path
    bin_dir: Path
    claude: Path

    @property
    def gt_home(self) -> Path:
        return self.root / "town"

    @property
    def origin(self) -> Path:
        return self.root / "origin.git"

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "PATH": f"{self.bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.root / "home"),
            "USER": self.name,
            "LOGNAME": self.name,
            "LANG": "C.UTF-8",
            "GT_HOME": str(self.gt_home),
            "GT_TMUX_SOCKET": f"gt-nonroot-{self.name}",
            "GT_CLAUDE_BIN": str(self.claude),
            **extra,
        }

    def run(self, *args: str, env: dict[str, str] | None = None, check: bool = True) -> str:
        """Run ``args`` as this user (blocking); returns stdout, fails the test with its output when it fails."""
        done = subprocess.run(
            list(args),
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            env=env or self.env(),
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"as {self.name}: {args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done.stdout


def _user_claude(uid: int, gid: int, root: Path) -> Path:
    """The pinned ``claude``, where the user can run it: in place, else hard-linked or copied into ``root``."""
    binary = claude_binary().resolve()
    if run_as(uid, gid, str(binary), "--version").returncode == 0:
        return binary
    target = root / "claude-bin" / "claude"
    target.parent.mkdir()
    link_or_copy(binary, target)
    probe = run_as(uid, gid, str(target), "--version")
    assert probe.returncode == 0, f"a normal user cannot run {target}: {probe.stderr}"
    return target


@pytest.fixture
def town_user() -> Iterator[TownUser]:
    """A throwaway user with a root dir of its own under /tmp (the test's tmp_path is root's and private)."""
    if os.geteuid() != 0:
        pytest.fail("this test creates a throwaway user (useradd): run it as root, as CI does")
    name = f"gtnr{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/bin/sh", "--user-group", name],
        check=True,
        capture_output=True,
        timeout=60,
    )
    root = Path(tempfile.mkdtemp(prefix=f"gt-{name}-"))
    try:
        entry = pwd.getpwnam(name)
        root.chmod(0o755)
        bin_dir = user_bin_dir(entry.pw_uid, entry.pw_gid, root)
        claude = _user_claude(entry.pw_uid, entry.pw_gid, root)
        (root / "home").mkdir()
        _make_origin(root)
        for path in (root, *root.rglob("*")):
            if not path.is_relative_to(root / "venv") and not path.is_relative_to(root / "claude-bin"):
                os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
        yield TownUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid, root=root, bin_dir=bin_dir, claude=claude)
    finally:
        remove_user(name)
        shutil.rmtree(root, ignore_errors=True)


def _make_origin(root: Path) -> None:
    src = root / "origin-src"
    identity = ["-c", "user.name=Test", "-c", "user.email=test@test.invalid"]
    subprocess.run(["git", "init", "--quiet", "-b", "main", str(src)], check=True, timeout=60)
    (src / "README.md").write_text("a project a normal user's polecats work on\n")
    subprocess.run(["git", "-C", str(src), "add", "."], check=True, timeout=60)
    subprocess.run(["git", "-C", str(src), *identity, "commit", "--quiet", "-m", "init"], check=True, timeout=60)
    subprocess.run(["git", "clone", "--quiet", "--bare", str(src), str(root / "origin.git")], check=True, timeout=60)


@contextlib.asynccontextmanager
async def town_of(user: TownUser, env: dict[str, str]) -> AsyncIterator[None]:
    """``gt up -d`` as the user; ``gt down --sessions`` and its tmux server ended afterwards (after a failed start
    too: a part of the town may be up)."""
    try:
        try:
            await asyncio.to_thread(user.run, "gt", "up", "-d", "--port", "0", env=env)
        except AssertionError as exc:
            logs = "".join(f"\n--- {log}:\n{log.read_text()[-3000:]}" for log in (user.gt_home / "logs").glob("*.log"))
            raise AssertionError(f"{exc}{logs}") from None
        yield
    finally:
        await asyncio.to_thread(user.run, "gt", "down", "--sessions", env=env, check=False)
        await asyncio.to_thread(user.run, "tmux", "-L", env["GT_TMUX_SOCKET"], "kill-server", env=env, check=False)


def nonroot_story(user: str, worktree: str) -> Script:
    guide = f"{worktree}/GUIDE.md"
    return Script(
        name="nonroot",
        turns=(
            use(bash("gt prime", expect="Current step: load-context")),
            # The session's own view of who it is: the town's user, and no IS_SANDBOX (only root needs it).
            use(bash('id -un; echo "sandbox=${IS_SANDBOX:-unset}"', expect=f"{user}\nsandbox=unset")),
            use(bash("gt step done load-context", expect="load-context: done")),
            use(write(guide, "a guide: draft\n")),
            use(edit(guide, "draft", "final", expect="updated")),
            use(bash("git add GUIDE.md && git commit -q -m 'a guide' && gt step done implement", expect="implement")),
            use(
                bash(
                    "gt step done commit && gt step done self-review && gt step done run-tests && "
                    "gt step done submit && gt done",
                    expect="merge request",
                )
            ),
            say("Submitted."),
        ),
    )


def _bead(user: TownUser, env: dict[str, str], bead: str) -> dict[str, Any]:
    shown: dict[str, Any] = json.loads(user.run("gt", "bead", "show", bead, "--json", env=env))
    return shown


async def test_a_town_run_by_a_normal_user_works_a_bead_with_claude_code_without_is_sandbox(
    town_user: TownUser,
) -> None:
    user = town_user
    worktree = str(user.gt_home / "rigs" / RIG / "polecats" / "ace")
    async with ModelServer([nonroot_story(user.name, worktree)], default="nonroot") as server:
        env = user.env(
            ANTHROPIC_BASE_URL=server.base_url,
            ANTHROPIC_API_KEY=TEST_KEY,
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            DISABLE_AUTOUPDATER="1",
            DISABLE_TELEMETRY="1",
            DISABLE_ERROR_REPORTING="1",
        )
        async with town_of(user, env):
            await asyncio.to_thread(
                user.run, "gt", "rig", "add", RIG, str(user.origin), "--agent", "claude", "--stall-after", "600",
                env=env,
            )  # fmt: skip
            bead = (await asyncio.to_thread(user.run, "gt", "bead", "create", "Write a guide", env=env)).strip()
            await asyncio.to_thread(user.run, "gt", "sling", bead, RIG, env=env)
            deadline = time.monotonic() + DEADLINE_S
            status = ""
            while time.monotonic() < deadline and not server.failures:
                status = (await asyncio.to_thread(_bead, user, env, bead))["status"]
                if status == "closed":
                    break
                await asyncio.sleep(0.5)
            # Merged may come before the agent's last turn (its `gt done` returns once its work is queued, and the
            # queue may merge it at once): the story is waited for too, before the town goes.
            wanted = len(nonroot_story(user.name, worktree).turns)
            await assert_eventually(lambda: len(server.turns("nonroot")) >= wanted, timeout=60)
            sessions = await asyncio.to_thread(user.run, "gt", "session", "list", "--bead", bead, "--all", env=env)
            assert server.failures == [], server.failures
            assert status == "closed", f"{bead} is {status!r} after {DEADLINE_S} s:\n{sessions}"
            guide = await asyncio.to_thread(user.run, "git", "--git-dir", str(user.origin), "show", "main:GUIDE.md")
    assert guide == "a guide: final\n", "Claude Code's Write then Edit, run by the user, merged"
    turns = server.turns("nonroot")
    assert len(turns) == len(nonroot_story(user.name, worktree).turns), "every turn of the story was asked for"
    # The witness (the user's) wrote the session's config home: the user's files, private.
    homes = list((user.gt_home / "rigs" / RIG / "sessions").glob("*/home/.claude/.claude.json"))
    assert homes, "the session's config home"
    assert all(home.stat().st_uid == user.uid for home in homes)
