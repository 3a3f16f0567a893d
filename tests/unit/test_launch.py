"""Which ``gt`` calls the client helper takes, and the request a call sends it (gt/launch.py, gt/cli/helper.py)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from gt import launch
from gt.cli import helper


@pytest.mark.parametrize(
    ("argv", "routed"),
    [
        (["ready"], True),
        (["bead", "create", "up"], True),
        (["--actor", "feed", "ready"], True),
        (["--nats-url=nats://x:1", "status"], True),
        (["--help"], True),
        ([], True),
        (["up", "-d"], False),
        (["down"], False),
        (["--nats-url", "nats://x:1", "feed"], False),
        (["dashboard"], False),
    ],
)
def test_long_running_and_supervising_commands_stay_in_their_own_process(argv: list[str], routed: bool) -> None:
    assert launch.routed(argv) is routed


def test_a_request_carries_the_call_whole(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GT_ODD", "a=b\nc ü")
    argv = ["bead", "create", "a title with spaces", "", "ü"]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        read_end, write_end = os.pipe()
        fds = [read_end, write_end, write_end]
        socket.send_fds(ours, [launch.request(argv)], fds)
        call = helper._receive(theirs)
        for fd in [read_end, write_end, *call.fds]:
            os.close(fd)
    assert call.argv == argv
    assert call.cwd == str(tmp_path)
    assert call.env == dict(os.environ)
    mask = os.umask(0)
    os.umask(mask)
    assert call.umask == mask
    assert len(call.fds) == 3


def test_a_request_from_another_version_is_refused() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        body = b"\0".join([b"gt-helper-0", launch.helper_key().encode(), b"/", b"18", b"0"])
        socket.send_fds(ours, [len(body).to_bytes(4, "big") + body], [0, 1, 2])
        with pytest.raises(helper.Refused, match="another version"):
            helper._receive(theirs)


def test_a_request_without_the_callers_descriptors_is_refused() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        ours.sendall(launch.request(["ready"]))
        with pytest.raises(helper.Refused, match="descriptors"):
            helper._receive(theirs)


def test_the_socket_is_never_in_a_directory_others_may_write(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    path = launch.socket_path()
    assert path is not None
    assert path.startswith(str(tmp_path / "gt") + "/")
    assert (tmp_path / "gt").stat().st_mode & 0o777 == 0o700
    (tmp_path / "gt").chmod(0o770)
    assert launch.socket_path() is None


def test_a_runtime_directory_too_deep_for_a_socket_falls_back_to_tmp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/nonexistent/" + "d" * 100)
    path = launch.socket_path()
    assert path == f"/tmp/gt-{os.getuid()}/helper-{launch.helper_key()}.sock"


def test_each_polecat_session_has_a_helper_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session's helper ends with its session (the pane's reaper ends every process of it): a helper shared by
    sessions would be killed mid-call by another session's end."""
    keys = []
    for session in ("hq-a-1", "hq-b-1", None):
        monkeypatch.setattr(launch, "_key", None)
        if session is None:
            monkeypatch.delenv("GT_SESSION", raising=False)
        else:
            monkeypatch.setenv("GT_SESSION", session)
        keys.append(launch.helper_key())
    monkeypatch.setattr(launch, "_key", None)
    assert len(set(keys)) == 3, keys
