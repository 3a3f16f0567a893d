"""Which GT_GATE_USER a refinery accepts at start-up (issue 20, point 3): a refinery that is not root cannot
start gates as another user, root is no gate user, an unknown name is refused; each error names the setting."""

from __future__ import annotations

import pwd

import pytest

from shared.host.gates.user import resolve

NOBODY = pwd.getpwnam("nobody").pw_uid


def test_unset_means_the_refinerys_own_user() -> None:
    assert resolve("", euid=0) is None


def test_a_root_refinery_switches_to_the_gate_user() -> None:
    user = resolve("nobody", euid=0)
    assert user is not None
    assert (user.uid, user.switch) == (NOBODY, True)
    assert user.process_options() == {"user": NOBODY, "group": user.gid, "extra_groups": []}


def test_a_refinery_running_as_the_gate_user_itself_needs_no_switch() -> None:
    user = resolve("nobody", euid=NOBODY)
    assert user is not None
    assert user.switch is False
    assert user.process_options() == {}


def test_a_refinery_that_is_not_root_refuses_another_gate_user() -> None:
    with pytest.raises(ValueError, match=r"GT_GATE_USER=nobody: the refinery runs as .*not root") as refused:
        resolve("nobody", euid=NOBODY + 1)
    assert "unset GT_GATE_USER" in str(refused.value)


def test_root_is_no_gate_user() -> None:
    with pytest.raises(ValueError, match="GT_GATE_USER=root: that is root"):
        resolve("root", euid=0)


def test_an_unknown_user_is_refused() -> None:
    with pytest.raises(ValueError, match="GT_GATE_USER=gt-no-such-user: no such user"):
        resolve("gt-no-such-user", euid=0)
