"""`gt up` / `gt down`: an embedded NATS server and the services as supervised child processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from gt.town.state import read_state
from gt.town_secrets import operator_login
from shared.core.config import TownConfig
from shared.host import processes
from shared.host.tmux import Tmux
from tests.helpers import gt_run, wait_until
from tests.log_tools import events_of, outcomes, read_all
from tests.witness_town import make_origin


class TownCli:
    def __init__(self, env: dict[str, str], home: Path, python: str = sys.executable) -> None:
        self.home = home
        self.env = {**env, "GT_HOME": str(home)}
        self.env.pop("NATS_URL", None)
        self.python = python
        """The Python `gt` runs with (and so the town's services, and the ``gt`` on its agents' PATH)."""

    def __call__(self, *args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
        return gt_run(self.env, *args, timeout=timeout, python=self.python)

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


def test_up_runs_the_town_and_down_stops_refinery_witness_mayor_deacon_then_nats(gt_town: TownCli) -> None:
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
    assert stopped == ["refinery", "witness", "mayor", "deacon"]
    order = [e["event"] for e in town_log if e["event"] in ("service_stopped", "nats_stopped")]
    assert order[-1] == "nats_stopped"
    for service in ("mayor", "witness", "refinery", "deacon"):
        events = [e["event"] for e in _log_events(gt_town.home / "logs" / f"{service}.log")]
        assert "service_stopped" in events  # each one shut down cleanly on SIGTERM

    # Up again: the services replay the log, and `gt up -d` shows that as a progress bar (asked for, as the
    # output is piped here).
    gt_town.env["GT_PROGRESS"] = "always"
    again = gt_town("up", "-d", "--port", "0")
    assert again.returncode == 0, again.stderr
    bars = [line for line in again.stderr.splitlines() if line.startswith("replaying the log [")]
    assert bars, again.stderr
    assert bars[-1].endswith("100%")


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


async def _as_operator(url: str, home: Path) -> Client:
    """A connection to the town `gt up` runs in ``home``, as its operator (its NATS server checks logins)."""
    login = operator_login(home)
    assert login is not None, f"no operator credentials under {home}"
    user, password = login
    return await nats.connect(url, user=user, password=password, inbox_prefix=f"_INBOX_{user}".encode())


def _service_events(url: str, service: str, home: Path) -> list[tuple[str, dict[str, Any]]]:
    async def read() -> list[tuple[str, dict[str, Any]]]:
        nc = await _as_operator(url, home)
        try:
            return await events_of(nc, f"gt.evt.service.{service}")
        finally:
            await nc.close()

    return asyncio.run(read())


def _restarted(town: TownCli, name: str, old: processes.ProcessRef) -> processes.ProcessRef | None:
    now = read_state(town.config)
    ref = now.services.get(name) if now else None
    return ref if ref is not None and ref.pid != old.pid and processes.is_alive(ref) else None


def test_witness_refinery_and_mayor_killed_in_turn_are_back_and_the_deacon_saw_each_go(gt_town: TownCli) -> None:
    assert gt_town("up", "-d", "--port", "0").returncode == 0
    state = read_state(gt_town.config)
    assert state is not None
    beads = []
    for name in ("witness", "refinery", "mayor"):
        old = state.services[name]
        assert old is not None
        os.kill(old.pid, signal.SIGKILL)
        # Work sent while it is down waits in GT_CMD and is carried out once it is back.
        created = gt_town("bead", "create", f"sent while the {name} was killed", "--wait")
        assert created.returncode == 0, created.stderr
        beads.append(created.stdout.strip())
        wait_until(lambda n=name, o=old: _restarted(gt_town, n, o), timeout=60, message=f"{name} restarted")  # type: ignore[misc]

        def seen_down_and_up(n: str = name) -> list[str]:
            kinds = [kind for kind, _ in _service_events(state.nats_url, n, gt_town.home)]
            assert kinds[-2:] == ["service.down", "service.up"], kinds
            return kinds

        wait_until(seen_down_and_up, timeout=60)
    for bead in beads:
        shown = gt_town("bead", "show", bead, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["id"] == bead
    now = read_state(gt_town.config)
    assert now is not None
    assert now.gave_up == []


def test_a_service_that_crashes_on_start_is_quarantined_and_escalated(gt_town: TownCli) -> None:
    gt_town.env["GT_MQ_BATCH"] = "0"  # the refinery refuses to start with it: a crash loop
    assert gt_town("up", "-d", "--port", "0").returncode == 0

    def quarantined() -> list[str]:
        state = read_state(gt_town.config)
        assert state is not None
        assert state.gave_up == ["refinery"]
        return state.gave_up

    wait_until(quarantined, timeout=120)

    def escalated() -> dict[str, Any]:
        listed = gt_town("escalations", "--json")
        assert listed.returncode == 0, listed.stderr
        found: list[dict[str, Any]] = [e for e in json.loads(listed.stdout) if e.get("source") == "supervisor/refinery"]
        assert found, listed.stdout
        return found[0]

    escalation = wait_until(escalated, timeout=60)
    assert escalation["severity"] == "critical"
    assert "refinery crashed 6 times" in escalation["message"]
    town_log = _log_events(gt_town.home / "logs" / "town.log")
    starts = [e for e in town_log if e["event"] == "service_started" and e["name"] == "refinery"]
    assert len(starts) == 6, "started once and restarted five times, then left down"
    assert gt_town("health", "mayor").returncode == 0, "the rest of the town runs on"
    again = gt_town("up", "-d", "--port", "0")
    assert again.returncode == 3, "a town with a service left down is not healthy"
    assert "already up" not in again.stdout
    assert "refinery kept crashing and is left down (escalated)" in again.stderr


def _left_down(town: TownCli) -> list[str]:
    now = read_state(town.config)
    return now.gave_up if now is not None else []


def test_a_quarantined_service_comes_back_with_gt_up_service_while_the_town_runs_on(gt_town: TownCli) -> None:
    """Issue 39: a service left down after a crash loop came back only through `gt down` + `gt up -d`."""
    no_town = gt_town("up", "--service", "refinery")
    assert no_town.returncode == 3, no_town
    assert "no town is running" in no_town.stderr
    assert gt_town("up", "-d", "--port", "0").returncode == 0
    state = read_state(gt_town.config)
    assert state is not None
    supervisor, mayor = state.supervisor, state.services["mayor"]
    # Killed six times (as the trial did): a crash loop, left down and escalated.
    while True:
        now = read_state(gt_town.config)
        assert now is not None
        if now.gave_up:
            break
        old = now.services["refinery"]
        if old is None or not processes.is_alive(old):
            continue
        os.kill(old.pid, signal.SIGKILL)
        wait_until(
            lambda o=old: _restarted(gt_town, "refinery", o) or _left_down(gt_town),  # type: ignore[misc]
            timeout=60,
            message="refinery restarted or left down",
        )
    assert now.gave_up == ["refinery"]
    unhealthy = gt_town("up", "-d", "--port", "0")
    assert unhealthy.returncode == 3
    assert "then `gt up --service refinery` starts it again" in unhealthy.stderr, unhealthy.stderr

    back = gt_town("up", "--service", "refinery")
    assert back.returncode == 0, back.stderr
    assert "refinery is up again" in back.stdout, back.stdout
    after = read_state(gt_town.config)
    assert after is not None
    assert (after.supervisor, after.gave_up, after.services["mayor"]) == (supervisor, [], mayor), "nothing else moved"
    assert gt_town("health", "refinery").returncode == 0
    assert "already up" in gt_town("up", "-d", "--port", "0").stdout
    # Supervised again, its crash count started over: one kill is one restart.
    restarted = after.services["refinery"]
    assert restarted is not None
    os.kill(restarted.pid, signal.SIGKILL)
    wait_until(lambda: _restarted(gt_town, "refinery", restarted), timeout=60, message="refinery restarted")
    # A running service is restarted too.
    assert mayor is not None
    again = gt_town("up", "--service", "mayor")
    assert again.returncode == 0, again.stderr
    new_mayor = (read_state(gt_town.config) or state).services["mayor"]
    assert new_mayor is not None
    assert new_mayor.pid != mayor.pid
    assert not processes.is_alive(mayor)


def test_down_keeps_worktrees_and_down_clean_removes_only_the_clean_pushed_ones(
    gt_town: TownCli, tmp_path: Path
) -> None:
    socket = f"gt-test-{uuid.uuid4().hex[:10]}"
    gt_town.env["GT_TMUX_SOCKET"] = socket
    origin = make_origin(tmp_path / "project")
    try:
        assert gt_town("up", "-d", "--port", "0").returncode == 0
        added = gt_town("rig", "add", "demo", str(origin), "--agent", "GT_AGENT_FAULT=hang gt-agent", "--wait")
        assert added.returncode == 0, added.stderr
        for title in ("left clean", "left dirty"):
            bead = gt_town("bead", "create", title, "--prefix", "demo", "--wait").stdout.strip()
            assert gt_town("sling", bead, "demo", "--wait").returncode == 0
        polecats = gt_town.home / "rigs" / "demo" / "polecats"

        def two_worktrees() -> list[Path]:
            # A worktree is made under a hidden temporary name (.NAME.X.tmp) and renamed into place: only placed ones.
            found = (
                sorted(p for p in polecats.iterdir() if not p.name.startswith(".") and (p / ".git").exists())
                if polecats.exists()
                else []
            )
            assert len(found) == 2, found
            return found

        clean, dirty = wait_until(two_worktrees, timeout=60)
        (dirty / "unsaved.txt").write_text("work nobody committed\n")
        assert gt_town("down").returncode == 0
        assert clean.exists(), "gt down keeps worktrees"
        assert dirty.exists()

        busy = gt_town("down", "--clean")
        assert "removed 0 clean worktree(s)" in busy.stdout
        assert busy.stderr.count("is in use by") == 2, "agents still run in them: nothing is removed under them"
        Tmux(socket).kill_server()
        wait_until(lambda: not processes.working_in(clean) and not processes.working_in(dirty), timeout=30)
        cleaned = gt_town("down", "--clean")
        assert cleaned.returncode == 0, cleaned.stderr
        assert "removed 1 clean worktree(s)" in cleaned.stdout
        assert f"worktree {dirty} has uncommitted changes; it is kept" in cleaned.stderr
        assert not clean.exists()
        assert (dirty / "unsaved.txt").read_text() == "work nobody committed\n"
    finally:
        Tmux(socket).kill_server()


def test_a_hung_service_is_killed_and_restarted_once_the_deacon_records_it_down(gt_town: TownCli) -> None:
    assert gt_town("up", "-d", "--port", "0").returncode == 0
    state = read_state(gt_town.config)
    assert state is not None
    hung = state.services["witness"]
    assert hung is not None
    os.kill(hung.pid, signal.SIGSTOP)  # alive, but silent: no heartbeats, no exit for the supervisor to see
    try:
        fresh = wait_until(lambda: _restarted(gt_town, "witness", hung), timeout=60, message="witness replaced")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(hung.pid, signal.SIGCONT)
    assert fresh is not None
    assert not processes.is_alive(hung), "the hung process was killed, not left beside its successor"
    kinds = [kind for kind, _ in _service_events(state.nats_url, "witness", gt_town.home)]
    assert "service.down" in kinds
    town_log = _log_events(gt_town.home / "logs" / "town.log")
    assert [e["pid"] for e in town_log if e["event"] == "service_hung"] == [hung.pid]


def _log_read(url: str, home: Path) -> tuple[list[tuple[int, str, bytes]], dict[str, list[str]]]:
    """Every message of GT_EVT, and the outcome events stored per command id."""

    async def read() -> tuple[list[tuple[int, str, bytes]], dict[str, list[str]]]:
        nc = await _as_operator(url, home)
        try:
            everything = await read_all(nc, "GT_EVT")
            by_command = {cmd_id: [env.type for env in envs] for cmd_id, envs in (await outcomes(nc)).items()}
            return everything, by_command
        finally:
            await nc.close()

    return asyncio.run(read())


def _nats_restarted(town: TownCli, old: processes.ProcessRef) -> processes.ProcessRef | None:
    now = read_state(town.config)
    ref = now.nats if now else None
    return ref if ref is not None and ref.pid != old.pid and processes.is_alive(ref) else None


def test_a_killed_nats_server_is_restarted_on_its_port_and_store_and_the_town_answers_again(gt_town: TownCli) -> None:
    assert gt_town("up", "-d", "--port", "0").returncode == 0
    state = read_state(gt_town.config)
    assert state is not None
    assert state.nats is not None
    before = gt_town("bead", "create", "sent before NATS died", "--wait", "--id", "before-nats-died")
    assert before.returncode == 0, before.stderr
    log_before, _ = _log_read(state.nats_url, gt_town.home)

    os.kill(state.nats.pid, signal.SIGKILL)
    fresh = wait_until(lambda: _nats_restarted(gt_town, state.nats), timeout=60, message="nats-server restarted")  # type: ignore[arg-type]
    assert fresh is not None
    now = read_state(gt_town.config)
    assert now is not None
    assert now.nats_url == state.nats_url, "on the same port: every client reconnects where it was"
    wait_until(lambda: gt_town("status").returncode == 0, timeout=60, message="`gt status` answers again")
    after = gt_town("bead", "create", "sent after NATS came back", "--wait", "--id", "after-nats-died")
    assert after.returncode == 0, after.stderr
    for bead in (before.stdout.strip(), after.stdout.strip()):
        shown = gt_town("bead", "show", bead, "--json")
        assert shown.returncode == 0, shown.stderr

    log_after, by_command = _log_read(state.nats_url, gt_town.home)
    assert log_after[: len(log_before)] == log_before, "the store came back whole: nothing in the log lost"
    assert by_command["before-nats-died"] == ["cmd.accepted"]
    assert by_command["after-nats-died"] == ["cmd.accepted"]
    assert "already up" in gt_town("up", "-d", "--port", "0").stdout, "healthy again"

    # Every service was silent while NATS was gone, and the deacon may have recorded it down; the supervisor
    # waits for its next heartbeat rather than kill it as hung: the very processes run on.
    def judged() -> list[dict[str, Any]]:
        town_log = _log_events(gt_town.home / "logs" / "town.log")
        downs = [d for kind, d in _service_events(state.nats_url, "*", gt_town.home) if kind == "service.down"]
        spared = [e for e in town_log if e["event"] == "service_beats_again"]
        assert len(spared) == len(downs), (downs, spared)
        return downs

    wait_until(judged, timeout=60)
    town_log = _log_events(gt_town.home / "logs" / "town.log")
    assert [e["event"] for e in town_log if e["event"] in ("nats_died", "nats_restarted")] == [
        "nats_died",
        "nats_restarted",
    ]
    assert [e for e in town_log if e["event"] in ("service_hung", "service_died")] == []
    now = read_state(gt_town.config)
    assert now is not None
    assert now.services == state.services


def _bound(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def test_a_nats_server_that_keeps_dying_is_left_down_said_by_gt_up_and_escalated_by_the_next_town(
    gt_town: TownCli,
) -> None:
    assert gt_town("up", "-d", "--port", "0").returncode == 0
    state = read_state(gt_town.config)
    assert state is not None
    assert state.nats is not None
    port = int(state.nats_url.rsplit(":", 1)[1])
    # Another program takes the port while NATS is dead (the supervisor frozen meanwhile, so it cannot restart
    # the server first): every restart fails.
    os.kill(state.supervisor.pid, signal.SIGSTOP)
    blocker = socket.socket()
    try:
        try:
            os.kill(state.nats.pid, signal.SIGKILL)
            blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            wait_until(lambda: _bound(blocker, port), timeout=10)  # once the dead server let go of it
            blocker.listen()
        finally:
            os.kill(state.supervisor.pid, signal.SIGCONT)

        def quarantined() -> list[str]:
            now = read_state(gt_town.config)
            assert now is not None
            assert now.gave_up == ["nats"], now.gave_up
            return now.gave_up

        wait_until(quarantined, timeout=120)
        town_log = _log_events(gt_town.home / "logs" / "town.log")
        assert len([e for e in town_log if e["event"] == "nats_died"]) == 5
        assert [e["event"] for e in town_log if e["event"] == "nats_crash_loop"] == ["nats_crash_loop"]
        # More than 15 s without NATS: each client said so once or twice per kind of error (the server gone, a
        # connection refused, a port that does not answer as NATS), not four times a second.
        # (Per connection: the witness has three, its own, its auth callout responder's and its kicker's.)
        for log_name in ("town.log", "mayor.log", "witness.log"):
            logged = [e for e in _log_events(gt_town.home / "logs" / log_name) if e["event"] == "nats_client_error"]
            for connection in {e.get("connection") for e in logged}:
                errors = [e for e in logged if e.get("connection") == connection]
                kinds = Counter(e["error"].split("(", 1)[0] for e in errors)
                assert max(kinds.values()) <= 2, (log_name, errors)
                assert len(errors) <= 6, (log_name, errors)

        again = gt_town("up", "-d", "--port", "0")
        assert again.returncode == 3, again.stdout + again.stderr
        assert "already up" not in again.stdout
        assert "the embedded NATS server kept crashing and is left down" in again.stderr
        status = gt_town("status")
        assert status.returncode == 3
        assert "NATS is unreachable" in status.stderr
        assert "embedded NATS server kept crashing and is left down" in status.stderr
        owed = list((gt_town.home / "run" / "escalations").glob("*.json"))
        assert len(owed) == 1, "written down, to be sent once a NATS answers"
    finally:
        blocker.close()

    assert gt_town("down").returncode == 0
    assert gt_town("up", "-d", "--port", str(port)).returncode == 0

    def escalated() -> dict[str, Any]:
        listed = gt_town("escalations", "--json")
        assert listed.returncode == 0, listed.stderr
        found: list[dict[str, Any]] = [e for e in json.loads(listed.stdout) if e.get("source") == "supervisor/nats"]
        assert found, listed.stdout
        return found[0]

    escalation = wait_until(escalated, timeout=60)
    assert escalation["severity"] == "critical"
    assert "the embedded NATS server crashed 6 times" in escalation["message"]
    assert not list((gt_town.home / "run" / "escalations").glob("*.json")), "sent once, then forgotten"
