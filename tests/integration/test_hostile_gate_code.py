"""A gate runs the code of the change it checks. With GT_GATE_USER its workspace is the gate user's and kept from
one merge to the next (``shared.host.gates.user.GateWorkspaces``): whatever a hostile change's gate does to it, the next
change's gate sees exactly its own commit's tracked files, nothing untracked, and no process of the earlier gate.

- The red team's lurker (issue 39): a `setsid` child that writes into the next gate's workspace; it must be gone
  with its gate (its watcher runs under the pane's reaper).
- The gate itself, in its workspace: it changes a tracked file the next commit shares and marks it skipped in
  the index (``--skip-worktree``: a plain ``checkout --force`` would leave it), names a smudge filter of its own
  for it (a checkout would write it through that), lists an untracked file in
  ``.git/info/exclude`` (a plain ``clean`` would keep it), points ``core.hooksPath`` at its own hook, and plants a
  loose object. The repository is made anew by root with the index of root's own last checkout.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.host import git
from shared.host.gates import execution
from shared.host.gates.user import GateWorkspaces, gate_user_environment
from shared.host.os_user import OsUser
from tests.integration.test_gate_user import gate_user  # noqa: F401 - the throwaway gate user fixture
from tests.witness_town import IDENTITY

CHECK = "if [ -e PASSED ]; then exit 0; fi\nif [ -e BROKEN ]; then exit 1; fi\nexit 0\n"
"""The project's own test: a change that adds BROKEN fails it; the file PASSED would make anything pass."""


class Rig:
    """A bare clone holding main (check.sh) and main + BROKEN (a change whose test fails)."""

    def __init__(self, root: Path) -> None:
        src = root / "src"
        git.git("init", "--quiet", "-b", "main", str(src))
        (src / "check.sh").write_text(CHECK)
        git.git("add", "-A", cwd=src)
        git.git(*IDENTITY, "commit", "--quiet", "-m", "main", cwd=src)
        self.main = git.git("rev-parse", "HEAD", cwd=src).strip()
        (src / "BROKEN").write_text("its test fails\n")
        git.git("add", "-A", cwd=src)
        git.git(*IDENTITY, "commit", "--quiet", "-m", "broken", cwd=src)
        self.broken = git.git("rev-parse", "HEAD", cwd=src).strip()
        self.bare = root / "repo.git"
        git.git("clone", "--quiet", "--bare", "--", str(src), str(self.bare))


@pytest.fixture
def user(gate_user: str) -> OsUser:  # noqa: F811
    entry = pwd.getpwnam(gate_user)
    return OsUser(name=gate_user, uid=entry.pw_uid, gid=entry.pw_gid, switch=True)


@pytest.fixture
def workspaces(user: OsUser, tmp_path: Path) -> Iterator[GateWorkspaces]:
    root = Path(f"/tmp/gt-gates-test-{os.getpid()}")
    yield GateWorkspaces(user, root)
    git.force_remove(root)


def gate(workspaces: GateWorkspaces, rig: Rig, commit: str, command: str, log: Path) -> int:
    with workspaces.prepared("demo", rig.bare, commit, pristine=False) as place:
        env = gate_user_environment(workspaces.user, {"PATH": os.environ["PATH"]}, place)
        result = execution.run_gate(
            "test", command, place / "work", log, 30, env, workspaces.user, records=log.parent / "gates"
        )
    return result.exit_code


def test_a_hostile_gates_lurker_cannot_make_a_later_changes_failing_gate_pass(
    workspaces: GateWorkspaces, tmp_path: Path
) -> None:
    rig = Rig(tmp_path)
    lurker = f'touch "$TMPDIR/up"; cd /; while :; do touch {workspaces.root}/*/work/PASSED; sleep 0.05; done'
    hostile = (
        f"setsid sh -c '{lurker}' </dev/null >/dev/null 2>&1 & "
        'while [ ! -e "$TMPDIR/up" ]; do sleep 0.05; done; exit 0'
    )
    assert gate(workspaces, rig, rig.main, hostile, tmp_path / "g1.log") == 0
    code = gate(workspaces, rig, rig.broken, "sleep 1; sh check.sh", tmp_path / "g2.log")
    left = subprocess.run(["pgrep", "-u", workspaces.user.name], capture_output=True, text=True).stdout.split()
    assert code != 0, "a later change's failing test passed: the hostile gate's leftover wrote into its workspace"
    assert not left, f"the hostile gate left processes of the gate user: {left}"


def test_a_hostile_gate_cannot_leave_its_workspace_so_a_later_changes_failing_gate_passes(
    workspaces: GateWorkspaces, tmp_path: Path
) -> None:
    rig = Rig(tmp_path)
    assert gate(workspaces, rig, rig.main, "sh check.sh", tmp_path / "g0.log") == 0, "main passes its own test"
    hook = workspaces.root / "demo" / "home" / "hook"
    hostile = (
        "set -e; "
        # check.sh is the same in the next commit: changed here and marked skipped, checkout --force would keep it.
        "printf 'exit 0\\n' > check.sh && git update-index --skip-worktree check.sh"
        # And should it be written again: through a smudge filter of its own that makes it pass.
        " && git config filter.pass.smudge 'sed s/exit.1/exit 0/' && echo 'check.sh filter=pass' > .git/info/attributes"
        # PASSED ignored by the repository's own exclude list: a plain clean keeps it.
        " && echo PASSED >> .git/info/exclude && touch PASSED"
        # Its own hooks and a loose object of its own in the repository.
        f" && printf '#!/bin/sh\\ntouch PASSED\\n' > {hook} && chmod +x {hook}"
        f" && git config core.hooksPath {hook.parent} && mkdir -p .git/objects/ff && touch .git/objects/ff/planted"
        ' && test -z "$(git status --porcelain)"'  # git itself now sees nothing changed
    )
    assert gate(workspaces, rig, rig.main, hostile, tmp_path / "g1.log") == 0, "the hostile gate did its work"
    code = gate(workspaces, rig, rig.broken, "sh check.sh", tmp_path / "g2.log")
    work = workspaces.root / "demo" / "work"
    assert code != 0, (tmp_path / "g2.log").read_text()
    assert (work / "check.sh").read_text() == CHECK, "the tracked file the hostile gate changed is its commit's again"
    assert not (work / "PASSED").exists()
    assert not (work / ".git" / "objects" / "ff").exists(), "nothing of the earlier repository is left"
    assert "hooksPath" not in (work / ".git" / "config").read_text()
    assert git.git("rev-parse", "HEAD", cwd=work).strip() == rig.broken
