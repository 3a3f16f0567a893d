"""`gt up --runners N` (env GT_RUNNERS): the supervisor runs N gate runners (runner-1 ... runner-N, ``services.runner``)
beside the services, each under the shipped accounts' user ``runner``, and the refinery's gates go to them
(GT_MQ_RUNNERS=N in its environment). They are supervised like the services: ready once each answers caught up,
restarted when killed, killed and restarted when hung (the deacon records them down), restarted by hand with
`gt up --service runner-N`, stopped by `gt down` right after the refinery."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
from pathlib import Path
from typing import Any

from gt.town.state import read_state
from shared.host import processes
from tests.helpers import wait_until
from tests.integration.test_town import TownCli, _as_operator, _log_events, _restarted, _service_events
from tests.log_tools import read_all
from tests.witness_town import TEST_COMMAND, make_origin

RUNNERS = ["runner-1", "runner-2"]


def gate_events(url: str, home: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every gate job event of the town's log, read as its operator: (type, payload)."""

    async def read() -> list[tuple[str, dict[str, Any]]]:
        nc = await _as_operator(url, home)
        try:
            stored = await read_all(nc, "GT_EVT", "gt.evt.gate.>")
        finally:
            await nc.close()
        return [(json.loads(data)["type"], json.loads(data)["data"]) for _, _, data in stored]

    return asyncio.run(read())


def test_up_with_runners_gates_on_them_supervises_them_and_down_stops_them_after_the_refinery(
    gt_env: dict[str, str], tmp_path: Path
) -> None:
    socket = f"gt-runners-{secrets.token_hex(4)}"
    town = TownCli({**gt_env, "GT_TMUX_SOCKET": socket, "GT_RUNNERS": "2"}, tmp_path / "town")
    try:
        up = town("up", "-d", "--port", "0")  # GT_RUNNERS from the environment, handed to the detached supervisor
        assert up.returncode == 0, up.stderr + up.stdout
        assert "runner-1, runner-2" in up.stdout, up.stdout
        state = read_state(town.config)
        assert state is not None
        assert state.ready
        assert list(state.services) == ["mayor", "witness", "refinery", *RUNNERS, "deacon"]
        assert all(ref is not None and processes.is_alive(ref) for ref in state.services.values())
        for name in RUNNERS:
            health = town("health", name, "--json")
            assert health.returncode == 0, health.stdout + health.stderr
            assert json.loads(health.stdout)["identity"] == name

        def listed() -> dict[str, Any] | None:
            shown = town("status", "--json")
            services: dict[str, Any] = json.loads(shown.stdout)["services"] if shown.returncode == 0 else {}
            return services if all(services.get(name, {}).get("state") == "healthy" for name in RUNNERS) else None

        services = wait_until(listed, timeout=30, interval=0.5, message="gt status lists the runners, healthy")
        assert services is not None
        assert list(services)[-2:] == RUNNERS

        # A change merged: its gates ran on a runner (the refinery asked for jobs: GT_MQ_RUNNERS=2).
        origin = make_origin(tmp_path / "project")
        added = town("rig", "add", "demo", str(origin), "--test", TEST_COMMAND, "--wait")
        assert added.returncode == 0, added.stderr
        bead = town("bead", "create", "Gated on a runner", "--prefix", "demo", "--wait").stdout.strip()
        assert town("sling", bead, "demo", "--wait").returncode == 0

        def closed() -> bool:
            shown = town("bead", "show", bead, "--json")
            return shown.returncode == 0 and json.loads(shown.stdout)["status"] == "closed"

        wait_until(closed, timeout=180, interval=0.5, message="the bead merged and closed")
        events = gate_events(state.nats_url, town.home)
        started = [data["runner"] for kind, data in events if kind == "gate.started"]
        assert started, events
        assert set(started) <= set(RUNNERS), started
        assert [data["passed"] for kind, data in events if kind == "gate.finished"][-1] is True
        for runner in set(started):  # each runner's clone of the rig is in its own home, GT_HOME/runners/<name>
            assert (town.home / "runners" / runner.removeprefix("runner-") / "demo" / "repo.git").is_dir(), runner

        # Killed: restarted by the supervisor.
        first = state.services["runner-1"]
        assert first is not None
        os.kill(first.pid, signal.SIGKILL)
        assert wait_until(lambda: _restarted(town, "runner-1", first), timeout=30, message="runner-1 restarted")

        # Hung (alive, silent): the deacon records it down, the supervisor kills it and starts it again.
        hung = state.services["runner-2"]
        assert hung is not None
        os.kill(hung.pid, signal.SIGSTOP)
        try:
            fresh = wait_until(lambda: _restarted(town, "runner-2", hung), timeout=90, message="runner-2 replaced")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(hung.pid, signal.SIGCONT)
        assert fresh is not None
        assert not processes.is_alive(hung), "the hung runner was killed, not left beside its successor"
        assert "service.down" in [kind for kind, _ in _service_events(state.nats_url, "runner-2", town.home)]
        assert [e["pid"] for e in _log_events(town.home / "logs" / "town.log") if e["event"] == "service_hung"] == [
            hung.pid
        ]

        # By hand, and only a runner the town runs.
        again = town("up", "--service", "runner-1")
        assert again.returncode == 0, again.stderr
        assert "runner-1 is up again" in again.stdout
        unknown = town("up", "--service", "runner-9")
        assert unknown.returncode == 2, unknown.stderr
        assert "runs no runner-9" in unknown.stderr

        assert town("down").returncode == 0
        stopped = [e["name"] for e in _log_events(town.home / "logs" / "town.log") if e["event"] == "service_stopped"]
        assert stopped[-6:] == ["refinery", *RUNNERS, "witness", "mayor", "deacon"]
        for name in RUNNERS:
            logged = [e["event"] for e in _log_events(town.home / "logs" / f"{name}.log")]
            assert "service_stopped" in logged, name
    finally:
        town("down")
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)


def test_runners_are_counted_and_named_as_gt_up_takes_them(gt_env: dict[str, str], tmp_path: Path) -> None:
    town = TownCli(gt_env, tmp_path / "town")
    for bad in ("-1", "many", "65"):
        run = town("up", "-d", "--runners", bad)
        assert run.returncode == 2, run.stderr
        assert "--runners" in run.stderr
    town.env["GT_RUNNERS"] = "x"
    assert town("up", "-d").returncode == 2, "GT_RUNNERS is checked as --runners is"
    health = town("health", "runner-")
    assert health.returncode == 2
    assert "runner-<name>" in health.stderr
