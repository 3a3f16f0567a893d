"""The tmux adapter's snapshot against a real tmux server in the states a patrol meets it in."""

import subprocess
import uuid
from collections.abc import Iterator

import pytest

from shared.tmux import Tmux


@pytest.fixture
def socket_name() -> Iterator[str]:
    name = f"gt-test-snapshot-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True, check=False)


def test_a_server_that_runs_with_no_session_has_no_panes(socket_name: str) -> None:
    """Its last session just ended and the server has not exited yet: tmux answers ``no current target``,
    which is no panes (the witness once took it for tmux being unavailable)."""
    tmux = Tmux(socket_name)
    assert tmux.snapshot() == {}, "no server"
    subprocess.run(
        ["tmux", "-L", socket_name, "-f", "/dev/null", "start-server", ";", "set", "-g", "exit-empty", "off"],
        check=True,
    )
    assert tmux.snapshot() == {}, "a server with no session"
    subprocess.run(["tmux", "-L", socket_name, "new-session", "-d", "-s", "one", "sleep 30"], check=True)
    assert list(tmux.snapshot()) == ["one"]
