"""What `gt up`, `gt status` and `gt down` tell the operator about a town in an odd state (issue 39): only the
answer on stdout, the cause of a failed start, a town whose supervisor was killed."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gt.embedded_nats import free_port
from gt.town.state import read_state
from shared.host import processes
from tests.helpers import wait_until
from tests.integration.test_town import TownCli


@pytest.fixture
def gt_town(gt_env: dict[str, str], tmp_path: Path) -> Iterator[TownCli]:
    cli = TownCli({**gt_env, "GT_LOG_LEVEL": "DEBUG"}, tmp_path / "town")  # library chatter, were it let out
    try:
        yield cli
    finally:
        cli("down")


def test_gt_up_d_on_a_running_town_prints_nothing_but_its_answer_on_stdout(gt_town: TownCli) -> None:
    """The trial: `2026-11-29 00:40:28 [debug    ] nats_closed` on stdout before `town already up (...)`."""
    assert gt_town("up", "-d", "--port", "0", "--services", "mayor").returncode == 0
    again = gt_town("up", "-d", "--port", "0", "--services", "mayor")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("town already up (supervisor pid "), again.stdout
    assert again.stdout.count("\n") == 1, again.stdout


def test_gt_up_d_with_the_nats_port_taken_says_the_cause(gt_town: TownCli) -> None:
    """The trial: `nats-server exited with 1 ... see .../logs/town.log`, and town.log did not hold the cause."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = gt_town("up", "-d", "--port", str(port), "--services", "mayor")
    assert run.returncode == 3, run
    said = run.stderr.strip().splitlines()[-1]
    assert said.startswith("gt: the town failed to start (exit 3): nats-server exited with 1 before listening"), said
    assert "address already in use" in said, said
    assert str(gt_town.home / "logs" / "nats-server.log") in said, said


def test_a_town_whose_supervisor_was_killed_is_found_and_said_so(gt_town: TownCli) -> None:
    """The trial: `kill -9` of the supervisor of a town on GT_NATS_PORT=24871, and `gt status` said "no town is
    running" after probing port 4222, while NATS and every service ran on. The CLI finds the town from its
    recorded state, reaches it, and says the supervisor is gone and how to get it back."""
    port = free_port()
    gt_town.env["GT_NATS_PORT"] = str(port)
    assert gt_town("up", "-d", "--services", "mayor").returncode == 0
    state = read_state(gt_town.config)
    assert state is not None
    assert state.nats_url.endswith(f":{port}")
    os.kill(state.supervisor.pid, signal.SIGKILL)  # kill -9
    wait_until(lambda: not processes.is_alive(state.supervisor))
    assert state.nats is not None
    assert processes.is_alive(state.nats), "NATS runs on"

    status = gt_town("status")
    assert "no town is running" not in status.stderr, status.stderr
    assert "4222" not in status.stderr, status.stderr
    assert "mayor" in status.stdout, status.stdout  # the town, read through its NATS
    gone = f"the supervisor of the town in GT_HOME ({gt_town.home}) is gone (pid {state.supervisor.pid} died)"
    assert gone in status.stderr, status.stderr
    assert "`gt up -d` takes the town over" in status.stderr, status.stderr
    created = gt_town("bead", "create", "while the supervisor is gone")
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip().startswith("hq-"), created.stdout

    # Without GT_HOME's record, GT_NATS_PORT still names where to look.
    (gt_town.home / "run" / "town.json").rename(gt_town.home / "run" / "town.json.away")
    try:
        bare = gt_town("bead", "show", created.stdout.strip())
        assert bare.returncode == 0, bare.stderr
    finally:
        (gt_town.home / "run" / "town.json.away").rename(gt_town.home / "run" / "town.json")

    again = gt_town("up", "-d", "--services", "mayor")
    assert again.returncode == 0, again.stderr
    assert "stopped leftovers of a town whose supervisor died" in again.stderr
    assert gt_town("status").stderr.count("is gone") == 0
