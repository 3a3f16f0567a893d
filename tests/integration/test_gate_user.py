"""Gates as another OS user (issue 20, point 3; ``GT_GATE_USER``): a gate cannot read what only the refinery's
user may (a 0600 credentials file, also not through a symlink the agent committed), its set-up output still
reaches its tests, it writes in its workspace, and the merge still merges. A gate user that cannot be used
stops the refinery at start-up with an error naming it. Real nats-server, git and a throwaway OS user.

These tests create an OS user, so they need root (the CI runs as root); anywhere else they fail, saying so."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from services.refinery.state import MergeRequest
from shared.core.config import TownConfig
from shared.host import git
from tests.helpers import assert_eventually
from tests.witness_town import IDENTITY, polecat_town

SECRET_TEXT = "s3cret-refinery-nats-password"


def need_root() -> None:
    assert os.geteuid() == 0, "this test creates an OS user to run gates as: run it as root (the CI does)"


@pytest.fixture
def gate_user() -> Iterator[str]:
    """A throwaway unprivileged OS user with no home; removed after the test (with anything it left running)."""
    need_root()
    name = f"gtgate{secrets.token_hex(4)}"
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    try:
        yield name
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True, check=False)
        subprocess.run(["userdel", "--force", name], capture_output=True, check=False)


@pytest.fixture
def credentials() -> Iterator[Path]:
    """A 0600 file of root's in a directory everyone may enter: only its mode keeps a gate out (it stands for the
    refinery's credentials, the file NATS_PASSWORD_FILE names)."""
    need_root()
    folder = Path(tempfile.mkdtemp(prefix="gt-refinery-creds-"))
    folder.chmod(0o755)
    path = folder / "nats-password"
    path.write_text(SECRET_TEXT + "\n")
    path.chmod(0o600)
    try:
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def gate_script(user: str, credentials: Path) -> str:
    """The rig's test command: code an agent wrote, trying to read the refinery's credentials, directly and
    through a symlink its branch committed; then doing what tests do (reading the set-up's output, writing)."""
    return "; ".join(
        [
            f"if cat {credentials}; then echo CREDENTIALS-READ; exit 12; fi",
            "echo CREDENTIALS-REFUSED",
            "if cat leak; then echo LEAK-READ; exit 13; fi",
            "echo LEAK-REFUSED",
            'echo "gate user: $(id -un)"',
            f'test "$(id -un)" = {user} || exit 11',
            'test "$(cat build.out)" = built || exit 14',
            "echo tested > test.out && test -s test.out && echo WROTE-IN-WORKSPACE",
            'touch "$HOME/h" "$TMPDIR/t" && echo HOME-AND-TMP-WRITABLE',
            'git log -1 --format="GIT-WORKS %s"',
            'test -z "$(git remote)" || exit 15',
            "test ! -e FAIL_TESTS",
        ]
    )


def push_with_symlink(origin: Path, branch: str, target: Path) -> str:
    """A polecat's branch adding a file and a symlink ``leak`` to ``target``; its head."""
    clone = origin.parent / f"scratch-{secrets.token_hex(4)}"
    git.git("clone", "--quiet", "--branch", "main", str(origin), str(clone))
    try:
        git.git("checkout", "--quiet", "-b", branch, cwd=clone)
        (clone / "feature.txt").write_text("new\n")
        (clone / "leak").symlink_to(target)
        git.git("add", "-A", ".", cwd=clone)
        git.git(*IDENTITY, "commit", "--quiet", "-m", f"{branch}: feature and a symlink", cwd=clone)
        git.git("push", "--quiet", "origin", f"HEAD:refs/heads/{branch}", cwd=clone)
        return git.git("rev-parse", "HEAD", cwd=clone).strip()
    finally:
        git.force_remove(clone)


async def test_a_gate_as_the_gate_user_cannot_read_the_refinerys_credentials_and_the_merge_still_merges(
    town: TownConfig,
    nc: Client,
    tmp_path: Path,
    gate_user: str,
    credentials: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GT_GATE_USER", gate_user)
    async with polecat_town(town, nc, tmp_path) as pt:
        await pt.add_rig(setup_command="echo built > build.out", test_command=gate_script(gate_user, credentials))
        bead = await pt.new_bead("Gate as another user", prefix="demo")
        branch = f"polecat/ann/{bead}"
        mr_id = await pt.submit(bead, branch, push_with_symlink(pt.origin, branch, credentials))

        def settled() -> MergeRequest:
            assert pt.refinery is not None
            mr = pt.refinery.projection.state.mrs.get(mr_id)
            assert mr is not None, "not applied yet"
            assert mr.status in ("merged", "failed"), mr.status
            return mr

        mr = await assert_eventually(settled, timeout=120, interval=0.1)
        logs = town.gt_home / "rigs" / "demo" / "refinery" / "logs"
        said = "\n".join(p.read_text(errors="replace") for p in sorted(logs.glob("*.log")))
        assert SECRET_TEXT not in said, f"a gate read the refinery's credentials:\n{said}"
        assert "CREDENTIALS-READ" not in said, said
        assert "LEAK-READ" not in said, said
        for seen in (f"gate user: {gate_user}", "CREDENTIALS-REFUSED", "LEAK-REFUSED", "WROTE-IN-WORKSPACE"):
            assert seen in said, f"{seen!r} missing from the gate's output:\n{said}"
        assert "HOME-AND-TMP-WRITABLE" in said, said
        assert f"GIT-WORKS {branch}: feature and a symlink" in said, said
        assert mr.status == "merged", (mr.status, mr.tail)
        assert not list(logs.glob("*on-target*")), "the gate failed on the branch (it ran again on the target)"
        assert git.git("show", "main:feature.txt", cwd=pt.origin) == "new\n"

    # The credentials are as they were (nothing followed the symlink to change their owner or mode), and nothing
    # of the gate user's is left in the temporary directory.
    info = credentials.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o600)
    uid = pwd.getpwnam(gate_user).pw_uid
    left = [p for p in Path(tempfile.gettempdir()).iterdir() if p.lstat().st_uid == uid]
    assert left == [], f"the gate's scratch directories were left behind: {left}"


def test_a_refinery_refuses_to_start_on_a_gate_user_that_does_not_exist(
    town: TownConfig, gt_env: dict[str, str]
) -> None:
    missing = f"gtnosuch{secrets.token_hex(3)}"
    env = {**gt_env, "NATS_URL": town.nats_url, "GT_HOME": str(town.gt_home), "GT_GATE_USER": missing}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "services.refinery"], env=env, capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the refinery started with GT_GATE_USER={missing}, a user that does not exist")
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "bad_configuration" in said, said
    assert f"GT_GATE_USER={missing}: no such user" in said, said
