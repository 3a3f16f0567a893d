"""GT_AGENT_USER: a git the witness runs in an agent's workspace after the session ended (its clean-up's ``git
status``) runs the agent's config, attributes and filters as the agent's user, and so under root's reaper
(``shared.host.git._run``): a process a filter detaches (no GT_SESSION, working in /) ends with that git. Found by the
red team (issue 39): before, it was in no reaper's tree and the witness's check before a worktree is reused did not
find it.

The agent (as its OS user) writes, in its own workspace, a clean filter for every path and leaves a tracked file
changed; the witness (root) runs ``git status`` there as the workspace's owner, and git runs the filter, which
detaches a process of the agents' user."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from services.witness.effects import leftovers
from shared.host import git


def test_a_process_a_clean_filter_detaches_in_the_witness_clean_up_ends_with_its_git() -> None:
    assert os.geteuid() == 0, "run as root: the witness as root, the agent as a throwaway user"
    name = f"gtrta{os.getpid()}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", name], check=True)
    tmp_path = Path("/nonexistent")
    try:
        entry = pwd.getpwnam(name)
        tmp_path = Path(tempfile.mkdtemp(prefix="gt-rt-"))
        tmp_path.chmod(0o755)
        ws = tmp_path / "polecats" / "p1"
        ws.mkdir(parents=True)
        proof = tmp_path / "proof"
        proof.mkdir()
        for d in (ws, proof):
            os.chown(d, entry.pw_uid, entry.pw_gid)

        def as_agent(*args: str) -> None:
            user = [f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", "--no-new-privs"]
            env = {"PATH": os.environ["PATH"], "HOME": str(ws)}
            subprocess.run(["setpriv", *user, *args], cwd=ws, check=True, env=env)

        # The session's work: a tracked file, committed.
        as_agent("git", "init", "-q")
        as_agent("sh", "-c", "echo a > f && git add f && git -c user.email=a@b -c user.name=a commit -qm base")
        # The hostile part, all in the agent's own workspace: a filter for every path, and the file changed.
        payload = f"cd /; while :; do date +%s > {proof}/alive; sleep 0.2; done"
        as_agent("git", "config", "filter.x.clean", f"setsid -f sh -c '{payload}' </dev/null >/dev/null 2>&1; cat")
        as_agent("sh", "-c", "echo '* filter=x' > .git/info/attributes && echo b > f")

        # The session ended (its reaper ended every process of it); the witness cleans up: git status as the owner.
        git.status_paths(ws)
        time.sleep(1)
        left = subprocess.run(["pgrep", "-u", name], capture_output=True, text=True).stdout.split()
        found = leftovers.find(roots=[], sessions={"s-ended"}, paths=[str(ws)], agent_uid=entry.pw_uid)
        assert not left, (
            f"a process of the agents' user outlived the session, started by the witness's git: {left}; "
            f"the pre-start check finds {[f.ref.pid for f in found]}"
        )
    finally:
        for pid in subprocess.run(["pgrep", "-u", name], capture_output=True, text=True).stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["userdel", "--force", name], capture_output=True, check=False)
        shutil.rmtree(tmp_path, ignore_errors=True)
