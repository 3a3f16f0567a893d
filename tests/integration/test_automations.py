"""Automations on a real nats-server with a real deacon: every gate type fires when it should and only then,
exec and formula actions run and end in completed or failed events, broken files are reported without
stopping the others, and a deacon killed between a gate opening and the run firing (or mid-run) never fires
twice after its restart.

The deacon runs in this process with a clock the test moves (cron and cooldown without waiting for real
minutes), or as a process of its own that a crash point kills with SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats.errors
import pytest
import structlog
from nats.aio.client import Client

from services.deacon.automations.definitions import AutomationSettings
from services.deacon.automations.state import command_id
from services.deacon.service import DeaconService
from services.deacon.settings import DeaconSettings
from services.mayor.service import MayorService
from shared.core.config import TownConfig
from shared.service import Service, ServiceSettings
from tests.chaos.test_witness_chaos import wait_for_crash
from tests.drivers import send_and_wait
from tests.helpers import assert_eventually, started
from tests.log_tools import SEEDED_RIGS, events_of, outcomes, read_all, seed_rigs
from tests.service_process import ServiceProcess

FAST = ServiceSettings(patrol_interval=0.5, idle_heartbeat=0.5, snapshot_check_interval=0.2)
NO_WATCH = DeaconSettings(watched=())
"""Liveness is not under test here: no service.down events or escalations for services these tests do not run."""
LOG_LINE = 'echo "$GT_AUTOMATION $GT_AUTOMATION_RUN $GT_AUTOMATION_GATE ${GT_AUTOMATION_EVENT_SEQ:--}" >> ran.log'


class Clock:
    """The deacon's time, moved by the test."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class AutoTown:
    def __init__(self, config: TownConfig, nc: Client) -> None:
        self.config = config
        self.nc = nc
        self.dir = config.gt_home / "automations"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.clock = Clock(datetime.now(UTC))
        self.deacon: DeaconService | None = None
        self.mayor: MayorService | None = None
        self._tasks: list[tuple[Service[Any], asyncio.Task[None]]] = []

    def write(self, name: str, body: str) -> Path:
        path = self.dir / f"{name}.toml"
        path.write_text("[automation]\n" + body)
        return path

    def ran(self) -> list[list[str]]:
        """The lines the LOG_LINE command wrote, split: [automation, run, gate, event seq]."""
        path = self.dir / "ran.log"
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []

    async def start(self, service: Service[Any]) -> None:
        self._tasks.append((service, await started(service)))

    async def start_mayor(self) -> MayorService:
        self.mayor = MayorService(self.config, FAST)
        await self.start(self.mayor)
        assert self.mayor.reader is not None
        await self.mayor.reader.wait_for_seq(await seed_rigs(self.nc, *SEEDED_RIGS), timeout=30)
        return self.mayor

    async def start_deacon(self) -> DeaconService:
        settings = AutomationSettings(directory=self.dir, grace_s=0.5)
        self.deacon = DeaconService(self.config, FAST, clock=self.clock, deacon=NO_WATCH, automations=settings)
        await self.start(self.deacon)
        return self.deacon

    async def stop_all(self) -> None:
        for service, task in reversed(self._tasks):
            await service.shutdown()
            await asyncio.wait_for(task, 30)
        self._tasks.clear()

    async def passes(self, n: int = 2) -> None:
        """Wake the deacon and wait for ``n`` reconciles: the last one started after the wake."""
        assert self.deacon is not None
        target = self.deacon.reconciles + n
        self.deacon.wake()
        deacon = self.deacon
        await assert_eventually(lambda: deacon.reconciles >= target, message="the deacon did not reconcile")

    async def events(self, name: str) -> list[tuple[str, dict[str, Any]]]:
        return await events_of(self.nc, f"gt.evt.automation.{name}")

    async def types(self, name: str) -> list[str]:
        return [t for t, _ in await self.events(name)]

    async def until_types(self, name: str, expected: list[str], timeout: float = 30) -> list[dict[str, Any]]:
        """Wait until the automation's events are exactly ``expected`` (by type); their payloads."""

        async def check() -> list[dict[str, Any]]:
            found = await self.events(name)
            assert [t for t, _ in found] == expected, found
            return [p for _, p in found]

        result: list[dict[str, Any]] = await assert_eventually(check, timeout=timeout, interval=0.05)
        return result

    async def command(self, subject: str, **body: Any) -> dict[str, Any]:
        cmd_id = f"t-{uuid.uuid4().hex[:12]}"
        return await send_and_wait(self.nc, subject, json.dumps({**body, "cmd_id": cmd_id}).encode(), cmd_id)

    async def query(self, what: str, **body: Any) -> Any:
        reply = await self.nc.request(f"gt.q.deacon.{what}", json.dumps(body).encode(), timeout=10)
        answer = json.loads(reply.data)
        assert answer["ok"], answer
        return answer["result"]

    async def new_closed_bead(self, title: str = "Something done") -> tuple[str, int]:
        """A bead filed and closed through the mayor; its id and the sequence of its bead.closed."""
        created = await self.command("gt.cmd.bead.create", title=title)
        assert created["type"] == "cmd.accepted", created
        bead = created["result"]["id"]
        closed = await self.command("gt.cmd.bead.close", id=bead, reason="done")
        assert closed["type"] == "cmd.accepted", closed
        [seq] = [s for s, (t, _) in await self._seqs(f"gt.evt.bead.{bead}") if t == "bead.closed"]
        return bead, seq

    async def _seqs(self, subject: str) -> list[tuple[int, tuple[str, dict[str, Any]]]]:
        out = []
        for seq, _subject, data in await read_all(self.nc, "GT_EVT", subject):
            envelope = json.loads(data)
            out.append((seq, (envelope["type"], envelope["data"])))
        return out


@pytest.fixture
async def at(town: TownConfig, nc: Client) -> AsyncIterator[AutoTown]:
    handle = AutoTown(town, nc)
    try:
        yield handle
    finally:
        await handle.stop_all()


# ---- every gate, in-process with a controlled clock ----------------------------------------------


async def test_cooldown_fires_runs_its_command_and_fires_again_only_after_the_interval(at: AutoTown) -> None:
    at.write("tidy", f'gate = "cooldown"\ninterval = "10m"\nexec = {json.dumps(LOG_LINE)}\n')
    await at.start_deacon()
    fired, completed = await at.until_types("tidy", ["automation.fired", "automation.completed"])
    assert (fired["gate"], fired["reason"], fired["action"]) == ("cooldown", "never run", "exec")
    assert at.ran() == [["tidy", fired["run_id"], "cooldown", "-"]]
    assert completed["run_id"] == fired["run_id"]
    at.clock.advance(300)
    await at.passes()
    assert len(await at.events("tidy")) == 2, "not before the interval has passed since the last fire"
    at.clock.advance(300)
    await at.passes(1)
    found = await at.until_types("tidy", ["automation.fired", "automation.completed"] * 2)
    assert found[2]["reason"] == "10m since the last fire (interval 10m)"
    assert len(at.ran()) == 2


async def test_cron_fires_once_in_its_minute_and_then_at_the_next_match(at: AutoTown) -> None:
    at.clock.now = datetime(2026, 5, 4, 9, 29, 50, tzinfo=UTC)
    at.write("report", f'gate = "cron"\nschedule = "30 9 * * *"\nexec = {json.dumps(LOG_LINE)}\n')
    await at.start_deacon()
    await at.passes()
    assert await at.events("report") == []
    listed = await at.query("automations")
    assert listed[0]["next_due"] == "2026-05-04T09:30:00+00:00"
    at.clock.now = datetime(2026, 5, 4, 9, 30, 5, tzinfo=UTC)
    await at.passes(1)
    fired, _ = await at.until_types("report", ["automation.fired", "automation.completed"])
    assert fired["reason"] == "schedule '30 9 * * *' matched 2026-05-04 09:30 UTC"
    at.clock.now = datetime(2026, 5, 4, 9, 30, 55, tzinfo=UTC)
    await at.passes()
    assert len(await at.events("report")) == 2, "once per matching minute"
    at.clock.now = datetime(2026, 5, 5, 9, 30, 0, tzinfo=UTC)
    await at.passes(1)
    found = await at.until_types("report", ["automation.fired", "automation.completed"] * 2)
    assert found[2]["reason"] == "schedule '30 9 * * *' matched 2026-05-05 09:30 UTC"


async def test_event_gate_fires_once_per_new_event_and_a_subject_filter_narrows_it(at: AutoTown) -> None:
    await at.start_mayor()
    at.write("on-close", f'gate = "event"\non = "bead.closed"\nexec = {json.dumps(LOG_LINE)}\n')
    await at.start_deacon()
    await at.passes()
    assert await at.events("on-close") == []
    _bead, first = await at.new_closed_bead()
    fired, _ = await at.until_types("on-close", ["automation.fired", "automation.completed"])
    assert fired["cursor"] == first
    assert at.ran() == [["on-close", fired["run_id"], "event", str(first)]]
    await at.passes()
    assert len(await at.events("on-close")) == 2, "the same event never fires twice"

    target = await at.command("gt.cmd.bead.create", title="Watched")
    watched = target["result"]["id"]
    at.write(
        "on-watched",
        f'gate = "event"\non = "bead.closed"\nsubject = "gt.evt.bead.{watched}"\nexec = {json.dumps(LOG_LINE)}\n',
    )
    _other, second = await at.new_closed_bead("Not watched")
    found = await at.until_types("on-close", ["automation.fired", "automation.completed"] * 2)
    assert found[2]["cursor"] == second
    await at.passes()
    assert await at.events("on-watched") == [], "another bead's close does not open a filtered gate"
    await at.command("gt.cmd.bead.close", id=watched)
    [(seq, _)] = [e for e in await at._seqs(f"gt.evt.bead.{watched}") if e[1][0] == "bead.closed"]
    fired_w, _ = await at.until_types("on-watched", ["automation.fired", "automation.completed"])
    assert fired_w["cursor"] == seq
    await at.passes()
    assert len(await at.events("on-watched")) == 2


async def test_condition_gate_runs_its_check_and_fires_when_it_passes(at: AutoTown) -> None:
    at.write("flagged", f'gate = "condition"\ncheck = "test -e flag"\ninterval = "1m"\nexec = {json.dumps(LOG_LINE)}\n')
    deacon = await at.start_deacon()
    await assert_eventually(lambda: deacon.automations.checks_run >= 1)
    await at.passes()
    assert await at.events("flagged") == []
    (at.dir / "flag").touch()
    await at.passes()
    assert await at.events("flagged") == [], "the next check is an interval after the last one"
    at.clock.advance(60)
    await at.passes(1)
    fired, _ = await at.until_types("flagged", ["automation.fired", "automation.completed"])
    assert fired["gate"] == "condition"
    assert fired["reason"].startswith("check passed (exit 0)")
    at.clock.advance(30)
    await at.passes()
    assert len(await at.events("flagged")) == 2, "at most one fire per interval while the condition holds"


async def test_manual_gate_fires_only_by_command_and_refuses_while_its_run_is_open(at: AutoTown) -> None:
    wait = "while [ ! -e release ]; do sleep 0.05; done; echo released"
    at.write("by-hand", f'gate = "manual"\nexec = {json.dumps(wait)}\ntimeout = "60s"\n')
    await at.start_deacon()
    at.clock.advance(86400)
    await at.passes()
    assert await at.events("by-hand") == []
    accepted = await at.command("gt.cmd.automation.run", name="by-hand", actor="operator:ann")
    assert accepted["type"] == "cmd.accepted", accepted
    run = accepted["result"]["run"]
    [fired] = await at.until_types("by-hand", ["automation.fired"])
    assert (fired["run_id"], fired["gate"], fired["reason"]) == (run, "manual", "run by operator:ann")
    shown = await at.query("automation", name="by-hand")
    assert shown["status"] == "running"
    assert shown["open_run"]["id"] == run
    refused = await at.command("gt.cmd.automation.run", name="by-hand")
    assert (refused["type"], refused["code"]) == ("cmd.rejected", "conflict")
    assert run in refused["message"]
    missing = await at.command("gt.cmd.automation.run", name="no-such")
    assert (missing["type"], missing["code"]) == ("cmd.rejected", "not_found")
    (at.dir / "release").touch()
    _, completed = await at.until_types("by-hand", ["automation.fired", "automation.completed"])
    assert completed["result"] == "released"
    again = await at.command("gt.cmd.automation.run", name="by-hand")
    assert again["type"] == "cmd.accepted"
    assert again["result"]["run"] != run


async def test_formula_action_slings_a_bead_and_the_run_stays_open_until_it_closes(at: AutoTown) -> None:
    mayor = await at.start_mayor()
    at.write("review", 'gate = "manual"\nformula = "polecat-work"\nrig = "demo"\ntitle = "Weekly review"\n')
    await at.start_deacon()
    accepted = await at.command("gt.cmd.automation.run", name="review")
    run = accepted["result"]["run"]

    def slung() -> str:
        beads = [b for b in mayor.projection.state.beads.values() if b.metadata.get("automation_run") == run]
        assert len(beads) == 1, beads
        bead = beads[0]
        assert (bead.title, bead.status, bead.rig) == ("Weekly review", "hooked", "demo")
        assert mayor.projection.state.molecules[bead.id].formula == "polecat-work"
        return bead.id

    bead = await assert_eventually(slung)
    shown = await at.query("automation", name="review")
    assert (shown["status"], shown["open_run"]["bead"]) == ("running", bead)
    refused = await at.command("gt.cmd.automation.run", name="review")
    assert refused["code"] == "conflict", "no fire while the previous run's bead is open"
    await at.command("gt.cmd.bead.close", id=bead, reason="reviewed")
    _, completed = await at.until_types("review", ["automation.fired", "automation.completed"])
    assert (completed["bead"], completed["result"]) == (bead, f"bead {bead} closed: reviewed")
    stored = await outcomes(at.nc)
    for step in ("create", "sling"):
        assert [e.type for e in stored[command_id("review", run, step)]] == ["cmd.accepted"]


async def test_a_refused_sling_fails_the_run_and_closes_its_bead(at: AutoTown) -> None:
    mayor = await at.start_mayor()
    at.write("broken-formula", 'gate = "manual"\nformula = "no-such-formula"\nrig = "demo"\n')
    await at.start_deacon()
    await at.command("gt.cmd.automation.run", name="broken-formula")
    _, failed = await at.until_types("broken-formula", ["automation.fired", "automation.failed"])
    assert failed["error"].startswith("bead.sling rejected (invalid):")
    assert "no-such-formula" in failed["error"]
    bead = failed["bead"]
    await assert_eventually(lambda: mayor.projection.state.beads[bead].status == "closed")


async def test_a_failing_and_a_hanging_command_are_recorded_failed(at: AutoTown) -> None:
    at.write("fails", 'gate = "manual"\nexec = "echo no disk left; exit 3"\n')
    at.write("hangs", 'gate = "manual"\nexec = "echo started; sleep 30"\ntimeout = "1s"\n')
    await at.start_deacon()
    await at.command("gt.cmd.automation.run", name="fails")
    await at.command("gt.cmd.automation.run", name="hangs")
    _, failed = await at.until_types("fails", ["automation.fired", "automation.failed"])
    assert (failed["exit_code"], failed["error"]) == (3, "exit 3; output ends:\nno disk left")
    _, hung = await at.until_types("hangs", ["automation.fired", "automation.failed"])
    assert hung["exit_code"] == 124
    assert hung["error"] == "timed out after 1s; output ends:\nstarted"


async def test_a_broken_file_is_reported_by_name_and_field_and_the_others_still_run(
    at: AutoTown, gt_env: dict[str, str]
) -> None:
    at.write("good", f'gate = "cooldown"\ninterval = "1h"\nexec = {json.dumps(LOG_LINE)}\n')
    at.write("broken", 'gate = "cron"\nschedule = "0 25 * * *"\nexec = "true"\n')
    with structlog.testing.capture_logs() as logs:
        await at.start_deacon()
        await at.until_types("good", ["automation.fired", "automation.completed"])
    [invalid] = [e for e in logs if e["event"] == "automation_invalid"]
    assert (invalid["automation"], invalid["field"]) == ("broken", "automation.schedule")
    assert invalid["file"] == str(at.dir / "broken.toml")
    listed = {a["name"]: a for a in await at.query("automations")}
    assert listed["broken"]["status"] == "invalid"
    assert "broken.toml: `automation.schedule` hour: value 25 is out of range 0-23" in listed["broken"]["error"]
    assert listed["good"]["status"] == "idle"
    refused = await at.command("gt.cmd.automation.run", name="broken")
    assert (refused["code"], "automation.schedule" in refused["message"]) == ("invalid", True)

    env = {**gt_env, "NATS_URL": at.config.nats_url, "GT_HOME": str(at.config.gt_home)}
    listing = await _gt(env, "automation", "list")
    assert listing.startswith("NAME")
    assert any(line.startswith("broken") and "invalid" in line for line in listing.splitlines())
    shown = json.loads(await _gt(env, "automation", "show", "good", "--json"))
    assert shown["history"][0]["status"] == "completed"
    fired = await _gt(env, "automation", "run", "good")
    assert fired.startswith("good: run run-")


async def _gt(env: dict[str, str], *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gt.cli.main",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


# ---- restarts: a deacon process killed by a crash point ------------------------------------------


def deacon_env(at: AutoTown, gt_env: dict[str, str], crash_at: str, marker: Path) -> dict[str, str]:
    return {
        **gt_env,
        "NATS_URL": at.config.nats_url,
        "GT_HOME": str(at.config.gt_home),
        "GT_AUTOMATION_GRACE": "0.5",
        "GT_WATCHED_SERVICES": "",
        "GT_CRASH_AT": crash_at,
        "GT_CRASH_MARKER": str(marker),
    }


@contextlib.asynccontextmanager
async def crashing_deacon(
    at: AutoTown, gt_env: dict[str, str], tmp_path: Path, crash_at: str
) -> AsyncIterator[ServiceProcess]:
    """A deacon process that kills itself at ``crash_at`` once; the test restarts it."""
    marker = tmp_path / "crashed"
    proc = ServiceProcess("deacon", deacon_env(at, gt_env, crash_at, marker), tmp_path / "deacon.log")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


async def until_ready(at: AutoTown) -> None:
    """Until the deacon answers that it has caught up (the streams exist: a command sent now is kept)."""

    async def ready() -> bool:
        try:
            return bool((await at.query("status"))["caught_up"])
        except (nats.errors.Error, TimeoutError) as exc:
            raise AssertionError(f"the deacon does not answer yet: {exc!r}") from exc

    caught_up: bool = await assert_eventually(ready, timeout=60, interval=0.1)
    assert caught_up


async def crash_and_restart(proc: ServiceProcess, tmp_path: Path) -> None:
    await wait_for_crash(proc, tmp_path / "crashed", timeout=60)
    assert proc.returncode() == -signal.SIGKILL
    proc.start()


GATES = {
    "cooldown": 'gate = "cooldown"\ninterval = "1h"\n',
    "cron": 'gate = "cron"\nschedule = "* * * * *"\n',
    "event": 'gate = "event"\non = "bead.closed"\n',
    "condition": 'gate = "condition"\ncheck = "true"\ninterval = "1h"\n',
}


@pytest.mark.parametrize("gate", sorted(GATES))
async def test_a_deacon_killed_between_gate_and_fire_fires_once_after_its_restart(
    at: AutoTown, gt_env: dict[str, str], tmp_path: Path, gate: str
) -> None:
    if gate == "event":
        await at.start_mayor()
        _bead, closed_seq = await at.new_closed_bead()
    at.write("job", GATES[gate] + f"exec = {json.dumps(LOG_LINE)}\n")
    async with crashing_deacon(at, gt_env, tmp_path, "deacon.before_fire") as deacon:
        await crash_and_restart(deacon, tmp_path)
        assert await at.events("job") == [], "the crash came before the fire was stored"
        payloads = await at.until_types("job", ["automation.fired", "automation.completed"], timeout=60)
        fired = payloads[0]
        assert fired["gate"] == gate
        if gate == "event":
            assert fired["cursor"] == closed_seq
        found = await at.events("job")
        fires = [p for t, p in found if t == "automation.fired"]
        if gate == "cron":
            # "* * * * *" may legitimately fire again in a later minute; never twice in one.
            minutes = [p["reason"] for p in fires]
            assert len(minutes) == len(set(minutes))
        else:
            assert len(fires) == 1
        assert len(at.ran()) == len(fires), "each fire ran its command once"
        assert deacon.returncode() is None, deacon.log_text()


async def test_a_run_fired_before_a_crash_is_never_run_twice_and_blocks_the_gate_until_settled(
    at: AutoTown, gt_env: dict[str, str], tmp_path: Path
) -> None:
    at.write("job", f'gate = "cooldown"\ninterval = "1h"\nexec = {json.dumps(LOG_LINE)}\ntimeout = "2s"\n')
    async with crashing_deacon(at, gt_env, tmp_path, "deacon.after_fired") as deacon:
        await crash_and_restart(deacon, tmp_path)
        [fired] = await at.until_types("job", ["automation.fired"])
        _, failed = await at.until_types("job", ["automation.fired", "automation.failed"], timeout=60)
        assert failed["run_id"] == fired["run_id"]
        assert "whether the command finished is unknown" in failed["error"]
        assert at.ran() == [], "the command never started: the crash came first, and it was not re-run"
        listed = {a["name"]: a for a in await at.query("automations")}
        assert listed["job"]["runs"] == 1
        assert await at.types("job") == ["automation.fired", "automation.failed"], "the cooldown counts from it"
        assert deacon.returncode() is None, deacon.log_text()


async def test_a_manual_run_whose_deacon_died_is_refused_while_open_then_settled(
    at: AutoTown, gt_env: dict[str, str], tmp_path: Path
) -> None:
    at.write("by-hand", f'gate = "manual"\nexec = {json.dumps(LOG_LINE)}\ntimeout = "3s"\n')
    async with crashing_deacon(at, gt_env, tmp_path, "deacon.after_fired") as deacon:
        await until_ready(at)
        accepted = await at.command("gt.cmd.automation.run", name="by-hand")
        run = accepted["result"]["run"]
        await crash_and_restart(deacon, tmp_path)
        refused = await at.command("gt.cmd.automation.run", name="by-hand")
        assert refused["code"] == "conflict", "the restarted deacon sees the open run"
        _, failed = await at.until_types("by-hand", ["automation.fired", "automation.failed"], timeout=60)
        assert failed["run_id"] == run
        again = await at.command("gt.cmd.automation.run", name="by-hand")
        assert again["type"] == "cmd.accepted", again
        settled = ["automation.fired", "automation.failed", "automation.fired", "automation.completed"]
        await at.until_types("by-hand", settled)
        assert at.ran() == [["by-hand", again["result"]["run"], "manual", "-"]]


async def test_a_command_that_finished_before_the_crash_is_not_run_again(
    at: AutoTown, gt_env: dict[str, str], tmp_path: Path
) -> None:
    at.write("job", f'gate = "cooldown"\ninterval = "1h"\nexec = {json.dumps(LOG_LINE)}\ntimeout = "2s"\n')
    async with crashing_deacon(at, gt_env, tmp_path, "deacon.after_exec") as deacon:
        await crash_and_restart(deacon, tmp_path)
        _, failed = await at.until_types("job", ["automation.fired", "automation.failed"], timeout=60)
        assert "unknown" in failed["error"]
        assert len(at.ran()) == 1, "it ran once, before the crash, and was not re-run"


@pytest.mark.parametrize("crash_at", ["deacon.after_fired", "deacon.after_sling"])
async def test_a_formula_run_resumes_after_a_crash_and_slings_one_bead(
    at: AutoTown, gt_env: dict[str, str], tmp_path: Path, crash_at: str
) -> None:
    mayor = await at.start_mayor()
    at.write("review", 'gate = "cooldown"\ninterval = "1h"\nformula = "polecat-work"\nrig = "demo"\n')
    async with crashing_deacon(at, gt_env, tmp_path, crash_at) as deacon:
        await crash_and_restart(deacon, tmp_path)
        [fired] = await at.until_types("review", ["automation.fired"])
        run = fired["run_id"]

        def one_bead() -> str:
            beads = [b for b in mayor.projection.state.beads.values() if b.metadata.get("automation_run") == run]
            assert len(beads) == 1, beads
            assert beads[0].status == "hooked"
            return beads[0].id

        bead = await assert_eventually(one_bead, timeout=60)
        stored = await outcomes(at.nc)
        for step in ("create", "sling"):
            assert [e.type for e in stored[command_id("review", run, step)]] == ["cmd.accepted"], "stored once"
        await at.command("gt.cmd.bead.close", id=bead, reason="done")
        _, completed = await at.until_types("review", ["automation.fired", "automation.completed"], timeout=60)
        assert completed["bead"] == bead
        assert [b.id for b in mayor.projection.state.beads.values() if b.metadata.get("automation") == "review"] == [
            bead
        ], "one bead for the run"
        assert deacon.returncode() is None, deacon.log_text()
