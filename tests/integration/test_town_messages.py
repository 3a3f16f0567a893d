"""What `gt up`, `gt status` and `gt down` tell the operator about a town in an odd state (issue 39): only the
answer on stdout, the cause of a failed start, a town whose supervisor was killed."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

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
