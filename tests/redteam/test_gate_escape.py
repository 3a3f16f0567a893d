"""Red team: a gate's code that leaves its process group (setsid) outlives the gate and its watcher, and a
refinery's start-up sweep (gate_runs.stop_leftovers) never finds it: the watcher signals the group only."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from services.refinery.effects import gate_runs
from shared import processes


def test_a_gate_child_in_a_session_of_its_own_outlives_the_gate(tmp_path: Path) -> None:
    # What a hostile change's test suite runs: a child in a new session (so a new process group), out of the
    # gate's cwd, waiting for later gates to tamper with.
    script = (
        f"setsid sh -c 'cd /; echo $$ > \"{tmp_path}/child\"; exec sleep 60' </dev/null >/dev/null 2>&1 & "
        f'while [ ! -s "{tmp_path}/child" ]; do sleep 0.05; done; exit 0'
    )
    with (tmp_path / "gate.log").open("wb") as out:
        code = gate_runs.run(
            ["sh", "-c", script], cwd=tmp_path, env={"PATH": os.environ["PATH"]}, out=out, timeout=30,
            records=tmp_path / "gates",
        )  # fmt: skip
    assert code == 0
    ref = processes.ref_of(int((tmp_path / "child").read_text()))
    assert ref is not None
    try:
        # A refinery starting now sweeps the records: there are none, and the escaped child is in no group.
        gate_runs.stop_leftovers(tmp_path / "gates")
        assert not processes.is_alive(ref), "a gate's setsid child outlived the gate and the next start's sweep"
    finally:
        if processes.is_alive(ref):
            os.kill(ref.pid, signal.SIGKILL)


def test_a_hostile_gate_as_the_gate_user_makes_a_later_changes_failing_gate_pass(tmp_path: Path) -> None:
    """GT_GATE_USER: the first gate (a hostile change's test suite) leaves a process of the gate user in a session
    of its own; the next gate (another change, whose test fails) runs in a fresh scratch clone, and the leftover
    writes into it (/tmp/gt-gate-<user>-*/ is 0711, its work/ the gate user's) so that gate passes."""
    import pwd
    import subprocess

    from services.refinery.effects import merger
    from services.refinery.effects.gate_user import gate_user_environment, workspace
    from shared.os_user import OsUser

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
