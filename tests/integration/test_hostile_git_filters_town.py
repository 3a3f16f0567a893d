"""GT_AGENT_USER (a root `gt up`, the agent as a throwaway user, its real tmux pane): a clean filter the agent names
in its own workspace is run by the witness's clean-up ``git status`` after the session ended, as the agents' user;
the process it detaches must not outlive the session and its worktree's release (tests/attacks/filter_pane.sh).
Found by the red team (issue 39), when the witness's gits ran outside any reaper."""

from __future__ import annotations

import json
import pwd
import secrets
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import psutil

from tests.helpers import wait_until
from tests.integration.test_agent_user import agent_user  # noqa: F401 - the throwaway OS user fixture
from tests.integration.test_town import TownCli
from tests.os_users import user_bin_dir
from tests.witness_town import make_origin

SCRIPT = Path(__file__).parent.parent / "attacks" / "filter_pane.sh"


def running_with(marker: str) -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline", "username"]):
        line = " ".join(proc.info.get("cmdline") or ())
        if marker in line and "filter_pane" not in line:
            found.append(f"{proc.pid} ({proc.info.get('username')}): {line[:160]}")
    return found


def test_a_process_a_filter_of_the_witness_git_detaches_does_not_outlive_the_session(
    gt_env: dict[str, str],
    agent_user: tuple[str, Path],  # noqa: F811
) -> None:
    name, readable = agent_user
    entry = pwd.getpwnam(name)
    bin_dir = user_bin_dir(entry.pw_uid, entry.pw_gid, readable)
    script = readable / "filter_pane.sh"
    shutil.copy(SCRIPT, script)
    script.chmod(0o755)
    socket = f"gt-rt-{secrets.token_hex(4)}"
    town = TownCli(
        {**gt_env, "GT_TMUX_SOCKET": socket, "GT_AGENT_USER": name}, readable / "town", str(bin_dir / "python")
    )
    mark = f"gt-rtfilter-{secrets.token_hex(4)}"
    try:
        up = town("up", "-d", "--port", "0")
        assert up.returncode == 0, up.stderr + up.stdout
        origin = make_origin(readable / "project")
        added = town("rig", "add", "demo", str(origin), "--agent", f"sh {shlex.quote(str(script))} {mark}")
        assert added.returncode == 0, added.stderr
        bead = town("bead", "create", "Outlive my session through the witness's git").stdout.strip()
        assert town("sling", bead, "demo").returncode == 0

        def cleaned() -> dict[str, object] | None:
            listed = town("session", "list", "--bead", bead, "--all", "--json")
            sessions: list[dict[str, object]] = json.loads(listed.stdout) if listed.returncode == 0 else []
            if (
                sessions
                and sessions[0]["status"] == "ended"
                and sessions[0]["cleaned"]
                and sessions[0]["worktree_removed"]
            ):
                return sessions[0]  # its worktree given up (released for the polecat's next bead, issue 41)
            return None

        session = wait_until(cleaned, timeout=240, interval=0.5, message="the session ended and gave its worktree up")
        assert session is not None
        time.sleep(2)
        left = running_with(mark)
        alive = Path(f"/tmp/{mark}.alive")
        proof = alive.read_text().strip() if alive.exists() else "-"
        assert not left, (
            f"session {session['id']} ended ({session.get('end_reason')}) and gave its worktree up, yet a process the "
            f"witness's git started for it runs on: {left}; last proof of life {proof}"
        )
    finally:
        town("down", "--sessions")
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)
        for line in running_with(mark):
            subprocess.run(["kill", "-9", line.split()[0]], check=False)
        for suffix in ("alive", "filter"):
            Path(f"/tmp/{mark}.{suffix}").unlink(missing_ok=True)
