"""A dead agent leaves no process behind: a hostile agent's pane (tests/attacks/detach_pane.sh) detaches a writer
with setsid and a double fork, ignoring SIGTERM and SIGHUP, that appends to a file in the worktree for ever; then its
session dies. Before the bead's next session gets the worktree the writer is gone, and nothing is written after: by
the pane's reaper (shared/host/reaper.py), or, where the agent killed its reaper first (a laptop town, where the reaper
runs as the agent's own user), by the witness's scan before a worktree is reused (effects/leftovers.py)."""

from __future__ import annotations

import asyncio
import functools
import json
import pwd
import secrets
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from services.witness.settings import WitnessSettings
from services.witness.state import Session
from shared.core.config import TownConfig
from shared.host import reaper
from tests.compose_stack import USERS, ComposeStack, Operator, run_where_agents_run, running_stack
from tests.conftest import REPO_ROOT
from tests.helpers import assert_eventually, running_with, wait_until
from tests.integration.test_agent_attacks import AGENT_UID
from tests.integration.test_agent_user import agent_user  # noqa: F401 - the throwaway OS user fixture
from tests.integration.test_town import TownCli
from tests.os_users import user_bin_dir
from tests.witness_town import PolecatTown, make_origin, polecat_town

SCRIPT = REPO_ROOT / "tests" / "attacks" / "detach_pane.sh"


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    settings = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0, respawn_backoff_s=0.5)
    async with polecat_town(town, nc, tmp_path, settings) as handle:
        yield handle


async def started(pt: PolecatTown, bead: str, attempt: int) -> Session:
    def check() -> Session:
        sessions = pt.sessions_of(bead)
        assert len(sessions) >= attempt, [(s.id, s.status, s.end_reason) for s in sessions]
        assert sessions[attempt - 1].status == "started", sessions[attempt - 1].status
        return sessions[attempt - 1]

    session: Session = await assert_eventually(check, timeout=90, interval=0.05)
    return session


@pytest.mark.parametrize("mode", ["keep-reaper", "kill-reaper"])
async def test_a_detached_writer_of_a_dead_session_is_gone_before_the_worktree_is_handed_on(
    pt: PolecatTown, mode: str
) -> None:
    mark = f"gt-detached-{uuid.uuid4().hex[:8]}"
    await pt.add_rig(agent_command=f"sh {shlex.quote(str(SCRIPT))} attack {mode} {mark}", max_respawns=3)
    bead = await pt.new_bead("Outlive my session")
    await pt.sling(bead)
    first = await started(pt, bead, 1)
    hostile = Path(first.worktree) / "HOSTILE.txt"
    await assert_eventually(lambda: running_with(f"writer {mark}"), timeout=60, message="the writer never started")
    second = await started(pt, bead, 2)
    assert second.worktree == first.worktree
    assert not running_with(f"writer {mark}"), "the detached writer runs on beside the next session"
    written = await asyncio.to_thread(hostile.read_text)
    # Nothing written since (the writer wrote every 0.2 s while it lived).
    for _ in range(10):
        await asyncio.sleep(0.3)
        assert await asyncio.to_thread(hostile.read_text) == written
    assert first.id in written
    assert second.id not in written
    if mode == "kill-reaper":
        assert Path(f"/tmp/{mark}.reaper").read_text().startswith("killed my reaper"), "a laptop's agent can kill it"
    [ended, _] = pt.sessions_of(bead)[:2]
    assert ended.end_reason in {"zombie", "dead"}, pt.endings([ended])


def test_the_reaper_ends_what_its_command_detached_and_exits_with_the_commands_status(tmp_path: Path) -> None:
    """The reaper on its own: a command that detaches a process ignoring SIGTERM (setsid, double fork) and exits 3."""
    out = tmp_path / "late.txt"
    mark = f"gt-reaped-{uuid.uuid4().hex[:8]}"
    detached = f"trap '' TERM HUP; sleep 2; echo late > {shlex.quote(str(out))} # {mark}"
    command = f"setsid sh -c {shlex.quote(f'sh -c {shlex.quote(detached)} &')} ; exit 3"
    done = subprocess.run([*reaper.argv(0.5), "sh", "-c", command], timeout=30, check=False)
    assert done.returncode == 3
    assert running_with(mark) == [], "the reaper exited with a process of its command still running"


def waiting_on_its_fifo(pid: int) -> bool:
    """The process is blocked opening a FIFO nobody writes yet (the kernel's ``wait_for_partner``)."""
    return Path(f"/proc/{pid}/wchan").read_text() == "wait_for_partner"


def test_a_waiting_reaper_runs_exactly_the_command_and_environment_it_is_launched_with(tmp_path: Path) -> None:
    """``--launch``: started first, the reaper runs nothing until it is given its command and whole environment
    through its FIFO (none of it on a command line), then runs it as it would have, and removes the FIFO."""
    fifo, out = tmp_path / "s1.launch", tmp_path / "env.txt"
    reaper.make_launch(str(fifo))
    proc = subprocess.Popen([*reaper.argv(0.5, launch=str(fifo))], env={"LEAKED": "from the reaper's own"})
    try:
        wait_until(lambda: waiting_on_its_fifo(proc.pid), timeout=30, message="the reaper never waited")
        assert not out.exists(), "nothing runs while it waits"
        env = {"PATH": "/usr/bin:/bin", "SECRET_KEY": "sk-" + "x" * 40, "EMPTY": "", "EQUALS": "a=b"}
        command = ["sh", "-c", f"env | sort > {shlex.quote(str(out))}; exit 4", "an argument", ""]
        reaper.give_launch(str(fifo), command, env, timeout=10)
        assert proc.wait(timeout=30) == 4
    finally:
        proc.kill()
    given = dict(line.split("=", 1) for line in out.read_text().splitlines())
    for own in ("PWD", "SHLVL", "_"):  # the shell's own
        given.pop(own, None)
    assert given == env, "exactly the launch's environment: nothing of the reaper's"
    assert not fifo.exists(), "read once and removed"
    assert "sk-" not in " ".join(reaper.argv(0.5, launch=str(fifo)))


def test_a_waiting_reaper_ends_with_its_pane_and_a_launch_nobody_reads_times_out(tmp_path: Path) -> None:
    fifo = tmp_path / "s2.launch"
    reaper.make_launch(str(fifo))
    proc = subprocess.Popen([*reaper.argv(0.5, launch=str(fifo))])
    try:
        wait_until(lambda: waiting_on_its_fifo(proc.pid), timeout=30, message="the reaper never waited")
        proc.send_signal(signal.SIGHUP)  # tmux closing its pane
        assert proc.wait(timeout=30) == -signal.SIGHUP, "waiting, it set nothing up: the hang-up ends it"
    finally:
        proc.kill()
    with pytest.raises(TimeoutError):
        reaper.give_launch(str(fifo), ["true"], {}, timeout=0.3)
    link = tmp_path / "s3.launch"
    link.symlink_to(fifo)
    with pytest.raises(OSError, match="symbolic links"):
        reaper.give_launch(str(link), ["true"], {}, timeout=0.3)  # never written through a link


def test_an_agent_of_its_own_os_user_cannot_kill_its_reaper_and_its_detached_writer_ends_with_its_session(
    gt_env: dict[str, str],
    agent_user: tuple[str, Path],  # noqa: F811
) -> None:
    """``GT_AGENT_USER`` (a root `gt up`, as the compose stack runs its witness): the pane's reaper is root's, outside
    the agent's ``setpriv``. The hostile agent's kill of it is refused; the writer it detached is ended with its
    session all the same, before the next session gets the worktree."""
    name, readable = agent_user
    entry = pwd.getpwnam(name)
    bin_dir = user_bin_dir(entry.pw_uid, entry.pw_gid, readable)
    script = readable / "detach_pane.sh"
    shutil.copy(SCRIPT, script)
    script.chmod(0o755)
    socket = f"gt-reaper-{uuid.uuid4().hex[:8]}"
    town = TownCli(
        {**gt_env, "GT_TMUX_SOCKET": socket, "GT_AGENT_USER": name}, readable / "town", str(bin_dir / "python")
    )
    mark = f"gt-detached-{uuid.uuid4().hex[:8]}"
    try:
        up = town("up", "-d", "--port", "0")
        assert up.returncode == 0, up.stderr + up.stdout
        origin = make_origin(readable / "project")
        added = town(
            "rig", "add", "demo", str(origin), "--agent", f"sh {shlex.quote(str(script))} attack kill-reaper {mark}"
        )
        assert added.returncode == 0, added.stderr
        bead = town("bead", "create", "Outlive my session as another user").stdout.strip()
        assert town("sling", bead, "demo").returncode == 0

        def sessions() -> list[dict[str, object]]:
            listed = town("session", "list", "--bead", bead, "--all", "--json")
            assert listed.returncode == 0, listed.stderr
            found: list[dict[str, object]] = json.loads(listed.stdout)
            return found

        wait_until(lambda: running_with(f"writer {mark}"), timeout=120, message="the writer never started")
        wait_until(
            lambda: len(sessions()) >= 2 and sessions()[1]["status"] == "started",
            timeout=120,
            message="no second session started",
        )
        first, second = sessions()[:2]
        assert not running_with(f"writer {mark}"), "the detached writer runs on beside the next session"
        hostile = Path(str(first["worktree"])) / "HOSTILE.txt"
        written = hostile.read_text()
        assert str(first["id"]) in written
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert hostile.read_text() == written, "written after its session ended"
            time.sleep(0.3)
        assert second["worktree"] == first["worktree"]
        assert Path(f"/tmp/{mark}.reaper").read_text().startswith("could not kill my reaper")
    finally:
        town("down", "--sessions")
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)
        Path(f"/tmp/{mark}.reaper").unlink(missing_ok=True)


@pytest.mark.compose_stack
def test_in_the_compose_stack_the_agents_detached_writer_ends_with_its_session(
    gt_env: dict[str, str], tmp_path: Path
) -> None:
    """The same hostile pane in the compose stack (in containers under podman when it is ready, else as local
    processes): there the witness is root and starts agents as the image's ``agent`` (``GT_AGENT_USER``), so the
    reaper is root's; the agent's kill of it is refused and its detached writer ends with its session."""
    passwords = {user: secrets.token_hex(12) for user in USERS}
    mark = f"gt-detached-{uuid.uuid4().hex[:8]}"
    with running_stack(REPO_ROOT, tmp_path / "stack", gt_env, passwords) as stack:
        gt = Operator(stack, gt_env, tmp_path / "operator-home")

        in_containers = isinstance(stack, ComposeStack)
        where = Path("/var/lib/gastown/detach") if in_containers else tmp_path / "detach"

        run_there = functools.partial(run_where_agents_run, stack)

        run_there("mkdir", "-p", str(where))
        run_there("sh", "-c", f"cat > {shlex.quote(str(where / 'detach_pane.sh'))}", stdin=SCRIPT.read_text())
        if in_containers:
            run_there("chown", "-R", f"{AGENT_UID}:{AGENT_UID}", str(where))
        writers = (
            # [w]riter: the regular expression does not match this command's own text.
            f"for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q '[w]riter {mark}' && echo $p;"
            " done; true"
        )
        origin = stack.make_origin()
        command = f"sh {shlex.quote(str(where / 'detach_pane.sh'))} attack kill-reaper {mark}"
        gt("rig", "add", "demo", origin, "--agent", command)
        bead = gt("bead", "create", "Outlive my session in a container")
        gt("sling", bead, "demo")

        def sessions() -> list[dict[str, object]]:
            found: list[dict[str, object]] = json.loads(gt("session", "list", "--bead", bead, "--all", "--json"))
            return found

        try:
            wait_until(lambda: run_there("sh", "-c", writers).strip(), timeout=180, message="the writer never started")
            wait_until(
                lambda: len(sessions()) >= 2 and sessions()[1]["status"] == "started",
                timeout=180,
                message="no second session started",
            )
        except AssertionError:
            print(stack.log_tail("witness", 60))
            raise
        first, second = sessions()[:2]
        assert second["worktree"] == first["worktree"]
        assert run_there("sh", "-c", writers).strip() == "", "the detached writer runs on beside the next session"
        hostile = str(Path(str(first["worktree"])) / "HOSTILE.txt")
        written = run_there("cat", hostile)
        assert str(first["id"]) in written
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert run_there("cat", hostile) == written, "written after its session ended"
            time.sleep(0.3)
        if in_containers:
            assert run_there("cat", f"/tmp/{mark}.reaper").startswith("could not kill my reaper"), "root's reaper"
