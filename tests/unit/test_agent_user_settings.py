"""Which GT_AGENT_USER a witness accepts at start-up, and what it checks of GT_HOME's place: the same rules as
GT_GATE_USER (one resolver), each error naming the setting and what to do."""

from __future__ import annotations

import pwd
import tempfile
from pathlib import Path

import pytest

from services.witness.effects.agent_user import check_reachable, resolve

NOBODY = pwd.getpwnam("nobody").pw_uid


def test_a_root_witness_starts_agents_as_the_user_with_no_way_back() -> None:
    user = resolve("nobody", euid=0)
    assert user is not None
    assert user.switch
    assert user.argv_prefix() == (
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={user.gid}",
        "--clear-groups",
        "--no-new-privs",
        "--",
    )
    assert resolve("", euid=0) is None


def test_a_witness_that_is_not_root_cannot_start_agents_as_another_user() -> None:
    with pytest.raises(ValueError, match=r"GT_AGENT_USER=nobody: the witness runs as .*not root.*unset GT_AGENT_USER"):
        resolve("nobody", euid=NOBODY + 1)
    with pytest.raises(ValueError, match="GT_AGENT_USER=root: that is root; name an unprivileged user agents"):
        resolve("root", euid=0)
    with pytest.raises(ValueError, match="GT_AGENT_USER=gt-no-such-user: no such user"):
        resolve("gt-no-such-user", euid=0)


def test_gt_home_behind_a_directory_closed_to_others_is_refused_with_the_fix(tmp_path: Path) -> None:
    user = resolve("nobody", euid=0)
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    with pytest.raises(ValueError, match=rf"cannot reach GT_HOME .*{closed} is closed to other users.*chmod o\+x"):
        check_reachable(user, closed / "town")
    open_root = Path(tempfile.mkdtemp())
    try:
        open_root.chmod(0o755)
        check_reachable(user, open_root / "town")  # nothing above it is closed
    finally:
        open_root.rmdir()
    check_reachable(None, closed / "town")  # no agent user: nothing to check
