"""The tmux adapter against a real tmux server, in the states the witness meets it in."""

import subprocess
import uuid
from collections.abc import Iterator

import pytest

from shared.host.tmux import Tmux
from tests.helpers import wait_until


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


def test_a_started_session_reports_its_pane_and_label_as_a_snapshot_then_sees_it(socket_name: str) -> None:
    tmux = Tmux(socket_name)
    started = tmux.start("one", "sleep 30", cwd="/", env={"PATH": "/usr/bin:/bin"}, label="hq-abc-1")
    assert started == tmux.snapshot()["one"], "what start returns is what a snapshot reads"
    assert started.label == "hq-abc-1"
    assert started.pane_pid > 0
    assert not started.dead


def test_the_tail_of_a_pane_is_read_only_while_it_carries_the_label(socket_name: str) -> None:
    tmux = Tmux(socket_name)
    assert tmux.tail_if_labelled("one", "hq-abc-1") == "", "no server"
    words = "printf 'first\\nlast words\\n'; exit 3"
    tmux.start("one", words, cwd="/", env={"PATH": "/usr/bin:/bin"}, label="hq-abc-1")
    wait_until(lambda: tmux.snapshot()["one"].dead, message="the pane's process exited")
    tail = tmux.tail_if_labelled("one", "hq-abc-1")
    assert tail.splitlines()[:2] == ["first", "last words"], tail
    assert tmux.tail_if_labelled("one", "hq-abc-2") == "", "another session's name: not its words"
    assert tmux.tail_if_labelled("two", "hq-abc-1") == "", "no such session"


@pytest.mark.parametrize("label", ["hq-abc-1", "odd label, with } and ;"])
def test_a_session_is_killed_only_while_it_carries_the_label(socket_name: str, label: str) -> None:
    tmux = Tmux(socket_name)
    assert not tmux.kill_if_labelled("one", label), "no server"
    tmux.start("one", "sleep 30", cwd="/", env={"PATH": "/usr/bin:/bin"}, label=label)
    tmux.start("two", "sleep 30", cwd="/", env={"PATH": "/usr/bin:/bin"}, label="hq-abc-2")
    assert not tmux.kill_if_labelled("one", "hq-abc-9"), "a newer session of the same name is not ours"
    assert set(tmux.snapshot()) == {"one", "two"}
    assert tmux.kill_if_labelled("one", label)
    assert set(tmux.snapshot()) == {"two"}
    assert not tmux.kill_if_labelled("one", label), "gone already"


def test_one_sessions_pane_is_read_by_its_exact_name(socket_name: str) -> None:
    tmux = Tmux(socket_name)
    assert tmux.pane_of("one") is None, "no server"
    started = tmux.start("one-two", "sleep 30", cwd="/", env={"PATH": "/usr/bin:/bin"}, label="hq-abc-1")
    assert tmux.pane_of("one-two") == started == tmux.snapshot()["one-two"]
    assert tmux.pane_of("one") is None, "a prefix of a session's name is not that session"
    assert tmux.pane_of("two") is None
