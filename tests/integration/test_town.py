"""`gt up` / `gt down`: an embedded NATS server and the services as supervised child processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared import processes
from shared.cli.town import read_state
from shared.config import TownConfig
from tests.helpers import wait_until


class TownCli:
    def __init__(self, env: dict[str, str], home: Path) -> None:
        self.home = home
        self.env = {**env, "GT_HOME": str(home)}
        self.env.pop("NATS_URL", None)

    def __call__(self, *args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "shared.cli.main", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    @property
    def config(self) -> TownConfig:
        return TownConfig(gt_home=self.home)


@pytest.fixture
def gt_town(gt_env: dict[str, str], tmp_path: Path) -> Iterator[TownCli]:
    cli = TownCli(gt_env, tmp_path / "town")
    try:
        yield cli
    finally:
        cli("down")


def _log_events(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            events.append(json.loads(line))
    return events


def test_up_runs_the_town_and_down_stops_it_in_reverse_order(gt_town: TownCli) -> None:
    up = gt_town("up", "-d", "--port", "0")
    assert up.returncode == 0, up.stderr + up.stdout
    assert "town up" in up.stdout
    state = read_state(gt_town.config)
    assert state is not None
    assert state.ready
    assert list(state.services) == ["mayor", "witness", "refinery", "deacon"]
    refs = [ref for ref in state.services.values() if ref is not None]
    assert len(refs) == 4
    assert all(processes.is_alive(ref) for ref in refs)
    assert state.nats is not None

    # The CLI finds the town's NATS (on a random port) through GT_HOME.
    created = gt_town("bead", "create", "from the demo")
    assert created.returncode == 0, created.stderr
    assert gt_town("bead", "show", created.stdout.strip()).returncode == 0
    for service in ("mayor", "witness", "refinery", "deacon"):
        assert gt_town("health", service).returncode == 0
    assert "already up" in gt_town("up", "-d", "--port", "0").stdout

    down = gt_town("down")
    assert down.returncode == 0
    assert "town down" in down.stdout
    assert not any(processes.is_alive(ref) for ref in refs)
    assert not processes.is_alive(state.nats)
    assert read_state(gt_town.config) is None

    town_log = _log_events(gt_town.home / "logs" / "town.log")
    stopped = [e["name"] for e in town_log if e["event"] == "service_stopped"]
    assert stopped == ["deacon", "refinery", "witness", "mayor"]
    order = [e["event"] for e in town_log if e["event"] in ("service_stopped", "nats_stopped")]
    assert order[-1] == "nats_stopped"
    for service in ("mayor", "witness", "refinery", "deacon"):
        events = [e["event"] for e in _log_events(gt_town.home / "logs" / f"{service}.log")]
        assert "service_stopped" in events  # each one shut down cleanly on SIGTERM


def test_a_killed_service_is_restarted_by_the_supervisor(gt_town: TownCli) -> None:
    assert gt_town("up", "-d", "--port", "0", "--services", "mayor").returncode == 0
    state = read_state(gt_town.config)
    assert state is not None
    first = state.services["mayor"]
    assert first is not None
    os.kill(first.pid, signal.SIGKILL)

    def restarted() -> bool:
        now = read_state(gt_town.config)
        ref = now.services.get("mayor") if now else None
        return ref is not None and ref.pid != first.pid and processes.is_alive(ref)

    wait_until(restarted, timeout=30)
    assert gt_town("bead", "create", "after restart").returncode == 0


def test_leftovers_of_a_killed_supervisor_are_stopped_by_the_next_up(gt_town: TownCli) -> None:
    assert gt_town("up", "-d", "--port", "0", "--services", "mayor").returncode == 0
    state = read_state(gt_town.config)
    assert state is not None
    os.kill(state.supervisor.pid, signal.SIGKILL)
    wait_until(lambda: not processes.is_alive(state.supervisor))
    mayor = state.services["mayor"]
    assert mayor is not None
    assert processes.is_alive(mayor)  # orphaned, still running

    again = gt_town("up", "-d", "--port", "0", "--services", "mayor")
    assert again.returncode == 0, again.stderr
    assert "stopped leftovers" in again.stderr
    assert not processes.is_alive(mayor)
    assert state.nats is not None
    assert not processes.is_alive(state.nats)


def test_unknown_services_are_a_usage_error(gt_town: TownCli) -> None:
    run = gt_town("up", "-d", "--services", "mayor,butler")
    assert run.returncode == 2
    assert "butler" in run.stderr
