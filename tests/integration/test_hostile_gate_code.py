"""A gate runs the code of the change it checks: what that code starts, however detached, ends with its gate
(its watcher runs under the pane's reaper), so it cannot tamper with the gates after it. Found by the red team
(issue 39): before, a `setsid` child of one gate wrote into the next gate's scratch clone and its failing test passed.
(The plain case, a gate's child that left its group, is in test_gate_processes.py.)"""

from __future__ import annotations

import os
from pathlib import Path


def test_a_hostile_gate_as_the_gate_user_cannot_make_a_later_changes_failing_gate_pass(tmp_path: Path) -> None:
    """GT_GATE_USER: the first gate (a hostile change's test suite) starts a process of the gate user in a session
    of its own that would write into the next gate's fresh scratch clone (/tmp/gt-gate-<user>-*/ is 0711, its work/
    the gate user's) so that gate's failing test passes; it must be gone with its gate, and the next gate fail."""
    import pwd
    import subprocess

    from services.refinery.effects import merger
    from services.refinery.effects.gate_user import gate_user_environment, workspace
    from shared.host.os_user import OsUser

    assert os.geteuid() == 0, "run as root: it creates a gate user"
    name = f"gtrt{os.getpid()}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        entry = pwd.getpwnam(name)
        user = OsUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid, switch=True)
        repo = tmp_path / "repo"
        repo.mkdir()
        for args in (
            ["init", "-q"],
            ["-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "x"],
        ):
            subprocess.run(["git", *args], cwd=repo, check=True)
        base = {"PATH": os.environ["PATH"]}
        lurker = (
            'touch "$TMPDIR/up"; cd /; '
            'while :; do for d in /tmp/gt-gate-*/work; do touch "$d/PASSED"; done; sleep 0.05; done'
        )
        hostile = (
            f"setsid sh -c '{lurker}' </dev/null >/dev/null 2>&1 & "
            'while [ ! -e "$TMPDIR/up" ]; do sleep 0.05; done; exit 0'
        )
        honest_but_failing = "sleep 2; test -f PASSED"  # this change's tests fail
        codes = []
        for n, command in enumerate((hostile, honest_but_failing)):
            with workspace(user, repo) as scratch:
                result = merger.run_gate(
                    "test", command, scratch / "work", tmp_path / f"gate{n}.log", 30,
                    gate_user_environment(user, base, scratch), user, records=tmp_path / "gates",
                )  # fmt: skip
                codes.append(result.exit_code)
        left = subprocess.run(["pgrep", "-u", name], capture_output=True, text=True).stdout.split()
        assert codes[1] != 0, "a later change's failing test passed: the hostile gate's leftover wrote into its clone"
        assert not left, f"the hostile gate left processes of the gate user: {left}"
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], check=False)
        subprocess.run(["userdel", "--force", name], capture_output=True, check=False)
