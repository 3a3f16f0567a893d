"""Agents as another OS user (``GT_AGENT_USER``), the way out of "an agent is the town's own user" (issue 38,
point 3): a town run by root (`gt up`, its embedded server with the town's accounts) whose witness starts each agent
as a throwaway user. From its real tmux pane, with exactly the session's environment, the agent
(tests/attacks/user_pane.sh) tries what an agent of the town's own user could do: read the town's secrets, push
to the rig's repository by its path and plant a hook there, write the witness's clone, kill the services, drive the
witness's tmux server. Every one is refused; the agent is that user; its honest change still goes through `gt done`
and the merge queue (its workspace, password, runtime dir and publish folder are its own, the clone's objects
readable to it), and every git the witness runs in its workspace runs as that user.

The test needs root (to create the user and run the town as root), as CI runs; it fails, never skips, otherwise.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shlex
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.host import git
from tests.helpers import LINGERING_AGENTS, wait_until
from tests.integration.test_town import TownCli
from tests.os_users import remove_user, user_bin_dir
from tests.witness_town import make_origin

SCRIPT = Path(__file__).parent.parent / "attacks" / "user_pane.sh"
DEADLINE_S = 180.0
REFUSED = (
    "read-operator-password",
    "read-admin-password",
    "read-issuer-seed",
    "read-session-key",
    "list-secrets",
    "list-town",
    "push-main-by-path",
    "plant-origin-hook",
    "write-clone-config",
    "write-clone-ref",
    "kill-services",
    "tmux-list",
    "tmux-send-keys",
)


@pytest.fixture
def agent_user() -> Iterator[tuple[str, Path]]:
    """A throwaway system user, and a directory it can read (0755) for what it must run."""
    if os.geteuid() != 0:
        pytest.fail("this test creates a throwaway user (useradd) and runs a town as root: run it as root, as CI does")
    name = f"gtag{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", "--user-group", name],
        check=True,
        capture_output=True,
        timeout=60,
    )
    root = Path(tempfile.mkdtemp(prefix=f"gt-{name}-"))
    root.chmod(0o755)
    try:
        yield name, root
    finally:
        remove_user(name)
        shutil.rmtree(root, ignore_errors=True)


def test_agents_as_their_own_os_user_reach_none_of_the_towns_files_or_processes(
    gt_env: dict[str, str], tmp_path: Path, agent_user: tuple[str, Path]
) -> None:
    name, readable = agent_user
    entry = pwd.getpwnam(name)
    bin_dir = user_bin_dir(entry.pw_uid, entry.pw_gid, readable)
    script = readable / "user_pane.sh"
    shutil.copy(SCRIPT, script)
    script.chmod(0o755)
    report = readable / "report"
    report.touch()
    os.chown(report, entry.pw_uid, entry.pw_gid)
    socket = f"gt-agent-user-{secrets.token_hex(4)}"
    env = {**gt_env, **LINGERING_AGENTS, "GT_TMUX_SOCKET": socket, "GT_AGENT_USER": name}
    # GT_HOME where another user may pass (the test's tmp_path is under root's private pytest dir).
    town = TownCli(env, readable / "town", python=str(bin_dir / "python"))
    try:
        up = town("up", "-d", "--port", "0")
        assert up.returncode == 0, up.stderr + up.stdout
        origin = make_origin(readable / "project")  # where the agent can read it (and fetch from it)
        main_before = git.git("rev-parse", "main", cwd=origin).strip()
        q = shlex.quote
        honest = "echo honest > HONEST.txt && git add HONEST.txt && git commit -qm honest && gt done; sleep 3600"
        command = f"sh {q(str(script))} {q(str(report))} {q(str(origin))}; {honest}"
        added = town("rig", "add", "demo", str(origin), "--agent", command)
        assert added.returncode == 0, added.stderr
        bead = town("bead", "create", "Work as the agents' user").stdout.strip()
        slung = town("sling", bead, "demo")
        assert slung.returncode == 0, slung.stderr
        services_before = _service_pids(town.home)

        def finished() -> str | None:
            text = report.read_text()
            return text if "done\tall" in text else None

        text = wait_until(finished, timeout=DEADLINE_S, interval=0.5, message="the pane's report")
        assert text is not None
        results = dict(line.split("\t", 1) for line in text.splitlines() if "\t" in line)
        assert results["whoami"] == name, text
        for attack in REFUSED:
            assert results.get(attack) == "refused", (attack, text)
        assert results["service-pids"].split(), "the pane saw the services it tried to kill"
        assert results["fetch-origin"] == "succeeded", "an agent still fetches the rig's newest base"

        def merged() -> bool:
            shown = town("bead", "show", bead, "--json")
            return shown.returncode == 0 and json.loads(shown.stdout)["status"] == "closed"

        try:
            wait_until(merged, timeout=DEADLINE_S, message="the honest change merged through the queue")
        except AssertionError:
            capture = ["tmux", "-L", socket, "capture-pane", "-p", "-t", "0"]
            pane = subprocess.run(capture, capture_output=True, text=True, check=False)
            print(pane.stdout, town("session", "list", "--all").stdout, town("mq", "list").stdout)
            for log_file in sorted((town.home / "logs").glob("*.log")):
                print(log_file.name, log_file.read_text()[-3000:])
            raise
        log = git.git("log", "--format=%s", "main", cwd=origin).splitlines()
        assert "honest" in log, log
        assert "ungated change straight to main" not in log, log
        assert git.git("rev-parse", "main~1", cwd=origin).strip() == main_before, "main moved by the merge only"
        assert not (origin / "hooks" / "pre-receive").exists()
        assert _service_pids(town.home) == services_before, "every service runs on, unkilled"
        assert town("health", "mayor").returncode == 0
    finally:
        town("down", "--sessions")
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)


def _service_pids(home: Path) -> dict[str, int]:
    """This town's services' processes, as its supervisor recorded them."""
    state = json.loads((home / "run" / "town.json").read_text())
    pids = {name: ref["pid"] for name, ref in state["services"].items() if ref}
    assert set(pids) >= {"mayor", "witness", "refinery", "deacon"}, state
    return pids


def test_a_root_service_works_in_a_repository_another_user_owns_as_that_user(
    tmp_path: Path, agent_user: tuple[str, Path]
) -> None:
    """The witness (root) reads an agent's workspace with git (its clean-up and done flow): git runs as the
    workspace's owner, so git does not refuse the repository as another user's and whatever its config names (a
    clean filter the agent wrote, here) runs with the agent's rights, never root's."""
    name, readable = agent_user
    entry = pwd.getpwnam(name)
    work = readable / "workspace"
    git.git("init", "--quiet", "-b", "main", str(work))
    (work / "README").write_text("a workspace\n")
    git.git("add", "README", cwd=work)
    git.git("-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit", "--quiet", "-m", "init", cwd=work)
    (work / "a.txt").write_text("a\n")
    (work / ".gitattributes").write_text("*.txt filter=evil\n")
    witness_of_filter = readable / "filter-ran-as"
    git.git("config", "filter.evil.clean", f"sh -c 'id -u > {witness_of_filter}; cat'", cwd=work)
    for path in (work, *work.rglob("*")):
        os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
    os.chown(readable, entry.pw_uid, entry.pw_gid)  # where the filter may write its proof
    state = git.worktree_state(work, "main")
    assert state.exists
    assert state.dirty, "its untracked files are seen"
    git.git("add", "a.txt", cwd=work)
    assert witness_of_filter.read_text().strip() == str(entry.pw_uid), "the filter ran as the owner, not root"
    assert (work / ".git" / "index").stat().st_uid == entry.pw_uid, "what git wrote is the owner's"
