"""Scale-out: several instances of one service scope (one acts, the others stand by and take over), witnesses
of disjoint rigs side by side, and an active instance frozen past its deadline that writes nothing when it wakes.

Witnesses run as real processes (``python -m services.witness``) on the test's own tmux server, with real git
and the reference agent; the mayor and the refinery (and, where liveness is checked, the deacon) run in the
test's process. Everything is judged from the log, the activity key and the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.js.errors
import psutil
import pytest
from nats.aio.client import Client

from gt.embedded_nats import EmbeddedServer
from services.deacon.service import DeaconService
from services.deacon.settings import DeaconSettings
from services.mayor.service import MayorService
from services.witness.state import WitnessState
from shared.core.config import TownConfig
from shared.core.errors import ActivityLostError
from shared.core.subjects import DEFAULT_ACTIVE_BUCKET, DEFAULT_SERVICE_BUCKET
from shared.model import activity, heartbeats
from shared.model.activity import Holder, Timing
from shared.model.events import Envelope, decode_envelope
from shared.service import ServiceSettings
from tests.chaos.test_witness_chaos import replayed, sessions_of, wait_converged
from tests.drivers import send_and_wait
from tests.helpers import assert_eventually, connected
from tests.log_tools import events_of, outcome_of, outcomes, read_all
from tests.service_process import ServiceProcess
from tests.witness_town import FAST, TEST_COMMAND, PolecatTown, make_origin, polecat_town

TTL = 4.0
"""GT_ACTIVE_TTL of the witness processes here (the default is 6 s)."""
TIMING = Timing(ttl_s=TTL)
TAKEOVER_BOUND_S = TTL + 2 * TIMING.poll_every + 4.0
"""A standby takes over within the TTL and a poll of the moment the holder stopped renewing (at once when it
sees the holder's process dead); the rest is slack for a loaded test machine."""
SLOW_AGENT = "GT_AGENT_STEP_PAUSE=0.5 gt-agent"


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    async with polecat_town(town, nc, tmp_path, with_witness=False) as handle:
        yield handle


def witness_env(gt_env: dict[str, str], pt: PolecatTown, *, rigs: str | None = None) -> dict[str, str]:
    env = {
        **gt_env,
        "NATS_URL": pt.config.nats_url,
        "GT_HOME": str(pt.config.gt_home),
        "GT_TMUX_SOCKET": pt.socket,
        "GT_KILL_GRACE": "1",
        "GT_MIN_ORPHAN_AGE": "60",
        "GT_ACTIVE_TTL": str(TTL),
    }
    if rigs is not None:
        env["GT_WITNESS_RIGS"] = rigs
        # Passed on to every agent the witness starts (GT_AGENT_*): tells which witness started which session.
        env["GT_AGENT_STARTED_BY"] = rigs
    return env


@contextlib.contextmanager
def stopped_at_exit(*procs: ServiceProcess) -> Iterator[None]:
    try:
        yield
    finally:
        for proc in procs:
            proc.stop()


# ---- what the NATS server holds -----------------------------------------------------------------


async def holder_of(nc: Client, identity: str) -> Holder | None:
    kv = await nc.jetstream().key_value(DEFAULT_ACTIVE_BUCKET)
    try:
        entry = await kv.get(identity)
    except nats.js.errors.KeyNotFoundError:
        return None
    return activity.decode(entry.value)


async def wait_active(nc: Client, identity: str, proc: ServiceProcess, timeout: float = 60) -> Holder:
    """Until ``proc`` holds the activity key of ``identity``; the key's value then."""

    async def holds() -> Holder:
        holder = await holder_of(nc, identity)
        assert proc.returncode() is None, f"it exited with {proc.returncode()}:\n{proc.log_text()[-3000:]}"
        assert holder is not None
        assert (holder.pid, holder.released) == (proc.pid, False), holder
        return holder

    result: Holder = await assert_eventually(holds, timeout=timeout, interval=0.05)
    return result


async def beats(nc: Client) -> list[heartbeats.ServiceHeartbeat]:
    kv = await nc.jetstream().key_value(DEFAULT_SERVICE_BUCKET)
    try:
        keys = await kv.keys()
    except nats.js.errors.NoKeysError:
        return []
    out = []
    for key in keys:
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            beat = heartbeats.decode((await kv.get(key)).value or b"")
            if beat is not None:
                out.append(beat)
    return out


async def wait_standby(nc: Client, identity: str, proc: ServiceProcess) -> heartbeats.ServiceHeartbeat:
    """Until ``proc`` beats as a caught-up standby of ``identity``."""

    async def standing_by() -> heartbeats.ServiceHeartbeat:
        assert proc.returncode() is None, proc.log_text()[-3000:]
        mine = [b for b in await beats(nc) if b.pid == proc.pid and b.service == identity]
        assert mine, f"no heartbeat of pid {proc.pid} yet"
        assert (mine[0].standby, mine[0].caught_up) == (True, True), mine
        return mine[0]

    result: heartbeats.ServiceHeartbeat = await assert_eventually(standing_by, timeout=60, interval=0.1)
    return result


async def log_of(nc: Client) -> list[Envelope]:
    return [decode_envelope(data) for _seq, _subject, data in await read_all(nc, "GT_EVT")]


def overlaps(log: list[Envelope]) -> list[str]:
    """Beads that ever had two sessions alive at once, read in log order: a session is alive from its
    ``session.requested`` to its ``session.ended``."""
    bead_of: dict[str, str] = {}
    alive: dict[str, set[str]] = {}
    found = []
    for env in log:
        if env.type == "session.requested":
            data = msgspec.json.decode(env.data)
            bead_of[data["session_id"]] = data["bead"]
            live = alive.setdefault(data["bead"], set())
            if live:
                found.append(f"{data['bead']}: {data['session_id']} requested while {sorted(live)} alive")
            live.add(data["session_id"])
        elif env.type == "session.ended":
            session = msgspec.json.decode(env.data)["session_id"]
            alive.get(bead_of.get(session, ""), set()).discard(session)
    return found


async def check_log(nc: Client, beads: list[str]) -> None:
    """No bead ever had two sessions at once, no command has two outcomes, every bead was submitted once."""
    log = await log_of(nc)
    assert not overlaps(log), overlaps(log)
    doubled = {cmd: len(found) for cmd, found in (await outcomes(nc)).items() if len(found) != 1}
    assert not doubled, f"commands with more than one outcome: {doubled}"
    submitted = [msgspec.json.decode(e.data)["bead"] for e in log if e.type == "mr.submitted"]
    assert sorted(submitted) == sorted(beads), submitted


async def service_events(nc: Client, identity: str) -> list[tuple[str, str]]:
    return [(kind, data.get("instance", "")) for kind, data in await events_of(nc, f"gt.evt.service.{identity}")]


# ---- one scope, two instances -------------------------------------------------------------------


async def test_one_witness_acts_and_its_standby_takes_over_a_kill_9_mid_workload(
    pt: PolecatTown, gt_env: dict[str, str], tmp_path: Path, record_property: Any
) -> None:
    deacon_watch = DeaconSettings(stale_after_s=2.0, startup_grace_s=120.0, watched=("witness",), tick_s=0.2)
    pt.deacon = DeaconService(pt.config, FAST, deacon=deacon_watch)
    await pt.start("deacon", pt.deacon)
    env = witness_env(gt_env, pt)
    first = ServiceProcess("witness", env, tmp_path / "witness-1.log")
    second = ServiceProcess("witness", env, tmp_path / "witness-2.log")
    with stopped_at_exit(first, second):
        first.start()
        active = await wait_active(pt.nc, "witness", first)
        second.start()
        standby = await wait_standby(pt.nc, "witness", second)

        await pt.add_rig(agent_command=SLOW_AGENT, max_polecats=4)
        beads = [await pt.new_bead(f"Work through a takeover {i}") for i in range(4)]
        for bead in beads:
            await pt.sling(bead)

        async def mid_workload() -> bool:
            state = await replayed(pt.nc)
            sessions = [s for b in beads for s in sessions_of(state, b)]
            assert len([s for s in sessions if s.status == "started"]) >= 2, [(s.id, s.status) for s in sessions]
            assert not any(state.beads[b].merge_requested for b in beads), "a bead finished already"
            return True

        mid_workload_done: bool = await assert_eventually(mid_workload, timeout=60, interval=0.2)
        assert mid_workload_done
        still = await holder_of(pt.nc, "witness")
        assert still is not None
        assert still.instance == active.instance, "the standby took a key that was renewed"
        assert not second.logged("activity_acquired")

        first.kill()
        killed_at = time.monotonic()
        taken = await wait_active(pt.nc, "witness", second, timeout=TAKEOVER_BOUND_S)
        took = time.monotonic() - killed_at
        print(f"standby takeover after kill -9 of the active witness: {took:.2f}s (bound {TAKEOVER_BOUND_S:.1f}s)")
        record_property("takeover_after_kill_s", round(took, 3))
        assert took < TAKEOVER_BOUND_S
        assert taken.instance == standby.instance

        # The key is taken before the line saying so is written: wait for the line.
        def acquired_once() -> dict[str, Any]:
            (acquired,) = second.logged("activity_acquired")
            return acquired

        acquired = await assert_eventually(acquired_once, timeout=30)
        assert acquired["took_over_from"] == active.instance

        await wait_converged(pt.nc, beads)
        await check_log(pt.nc, beads)
        assert second.returncode() is None, second.log_text()[-3000:]

        # The deacon saw the active one go and the standby come, once each: the standby's beats alone never
        # made the witness up, and nothing flapped.
        expected = [
            ("service.up", active.instance),
            ("service.down", active.instance),
            ("service.up", standby.instance),
        ]

        async def recorded() -> bool:
            assert await service_events(pt.nc, "witness") == expected
            return True

        recorded_done: bool = await assert_eventually(recorded, timeout=30, interval=0.2)
        assert recorded_done
        seen_before = pt.deacon.reconciles
        await assert_eventually(lambda: pt.deacon is not None and pt.deacon.reconciles > seen_before + 2)
        assert await service_events(pt.nc, "witness") == expected


# ---- disjoint scopes ----------------------------------------------------------------------------


def agents_started_by(town: TownConfig) -> set[tuple[str, str]]:
    """(rig, the scope of the witness that started it) of every process running in a polecat session now."""
    found = set()
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            env = proc.environ()
            if env.get("GT_HOME") == str(town.gt_home) and "GT_SESSION" in env:
                found.add((env.get("GT_RIG", "?"), env.get("GT_AGENT_STARTED_BY", "?")))
    return found


async def test_witnesses_of_disjoint_rigs_serve_their_own_and_a_rig_nobody_serves_waits(
    pt: PolecatTown, gt_env: dict[str, str], tmp_path: Path
) -> None:
    east = ServiceProcess("witness", witness_env(gt_env, pt, rigs="east"), tmp_path / "witness-east.log")
    west = ServiceProcess("witness", witness_env(gt_env, pt, rigs="west"), tmp_path / "witness-west.log")
    north = ServiceProcess("witness", witness_env(gt_env, pt, rigs="north"), tmp_path / "witness-north.log")
    east_origin = make_origin(tmp_path / "east")
    with stopped_at_exit(east, west, north):
        east.start()
        west.start()
        await wait_active(pt.nc, "witness-east", east)
        await wait_active(pt.nc, "witness-west", west)

        for rig, origin in (("east", east_origin), ("west", pt.origin)):
            await pt.ok(
                "gt.cmd.rig.add", name=rig, repo=str(origin), test_command=TEST_COMMAND, agent_command=SLOW_AGENT
            )
        beads = {rig: [await pt.new_bead(f"{rig} work {i}") for i in range(2)] for rig in ("east", "west")}
        for rig, ids in beads.items():
            for bead in ids:
                await pt.sling(bead, rig)
        everything = [b for ids in beads.values() for b in ids]

        started_by: set[tuple[str, str]] = set()

        async def converged() -> WitnessState:
            started_by.update(agents_started_by(pt.config))  # sampled while the agents run
            return await wait_converged(pt.nc, everything, timeout=0.01)

        final: WitnessState = await assert_eventually(converged, timeout=150, interval=0.2)

        assert final.rigs.keys() >= {"east", "west"}
        await check_log(pt.nc, everything)
        assert started_by == {("east", "east"), ("west", "west")}, started_by

        # Each witness's log names only its own rig's sessions and beads.
        for proc, rig in ((east, "east"), (west, "west")):
            requested = proc.logged("session_requested")
            assert {e["bead"] for e in requested} == set(beads[rig]), requested
            assert proc.returncode() is None, proc.log_text()[-3000:]
        # A command naming nothing any witness knows is rejected by one of them, once.
        nudge = await pt.command("gt.cmd.nudge.send", target="nowhere/ace", message="hello")
        assert (nudge["type"], nudge["code"]) == ("cmd.rejected", "not_found")

        # A rig that no running witness serves: its command waits in GT_CMD, handed back by both witnesses,
        # until a witness that serves it starts; then it gets its one outcome.
        js = pt.nc.jetstream()
        before = (await js.consumer_info("GT_CMD", "witness-cmd")).num_redelivered or 0
        cmd_id = f"t-north-{uuid.uuid4().hex[:8]}"
        body = {"name": "north", "repo": str(pt.origin), "cmd_id": cmd_id}
        await pt.nc.publish("gt.cmd.rig.add", json.dumps(body).encode())

        async def handed_back() -> bool:
            info = await js.consumer_info("GT_CMD", "witness-cmd")
            assert (info.num_redelivered or 0) > before, info
            assert info.num_ack_pending or info.num_pending, info
            return True

        handed_back_done: bool = await assert_eventually(handed_back, timeout=30, interval=0.1)
        assert handed_back_done
        with pytest.raises(nats.js.errors.NotFoundError):
            await js.get_last_msg("GT_EVT", f"gt.evt.cmd.{cmd_id}")
        north.start()
        await wait_active(pt.nc, "witness-north", north)
        outcome = await outcome_of(pt.nc, cmd_id, timeout=60)
        assert (outcome["type"], outcome["result"]["rig"]) == ("cmd.accepted", "north")
        assert len((await outcomes(pt.nc))[cmd_id]) == 1


# ---- frozen past its deadline -------------------------------------------------------------------


async def test_an_active_witness_frozen_while_its_standby_took_over_writes_nothing_when_it_wakes(
    pt: PolecatTown, gt_env: dict[str, str], tmp_path: Path, record_property: Any
) -> None:
    env = witness_env(gt_env, pt)
    first = ServiceProcess("witness", env, tmp_path / "witness-1.log")
    second = ServiceProcess("witness", env, tmp_path / "witness-2.log")
    third = ServiceProcess("witness", env, tmp_path / "witness-3.log")
    with stopped_at_exit(first, second, third):
        first.start()
        await wait_active(pt.nc, "witness", first)
        second.start()
        await wait_standby(pt.nc, "witness", second)
        # Some history first, worked by the first witness: its projection holds a rig, a polecat, a bead.
        await pt.add_rig()
        bead = await pt.new_bead("Worked before the freeze")
        await pt.sling(bead)
        await wait_converged(pt.nc, [bead])

        async def quiet() -> bool:
            assert pt.mayor is not None
            state = pt.mayor.projection.state
            assert state.beads[bead].status == "closed"
            assert all(c.status == "closed" for c in state.convoys.values()), "a convoy is still open"
            return True

        quiet_done: bool = await assert_eventually(quiet, timeout=60, interval=0.2)
        assert quiet_done

        first.signal(signal.SIGSTOP)  # alive but frozen: the standby must wait out the TTL
        frozen_at = time.monotonic()
        await wait_active(pt.nc, "witness", second, timeout=TAKEOVER_BOUND_S)
        took = time.monotonic() - frozen_at
        print(f"standby takeover from a frozen active witness: {took:.2f}s (TTL {TTL:g}s)")
        record_property("takeover_after_sigstop_s", round(took, 3))
        # It saw the last renewal no earlier than a renewal interval before the freeze, and waited a whole TTL.
        assert TTL - TIMING.renew_every - 0.2 <= took < TAKEOVER_BOUND_S
        second.kill()

        # A witness command only an active witness would settle, stored while none acts.
        js = pt.nc.jetstream()
        last_before = int((await js.stream_info("GT_EVT")).state.last_seq)
        cmd_id = f"t-nudge-{uuid.uuid4().hex[:8]}"
        body = {"target": "demo/ace", "message": "still there?", "cmd_id": cmd_id}
        await pt.nc.publish("gt.cmd.nudge.send", json.dumps(body).encode())
        first.signal(signal.SIGCONT)

        await assert_eventually(lambda: first.returncode() is not None, timeout=60, interval=0.1)
        assert first.returncode() == 1, first.log_text()[-3000:]
        assert first.logged("activity_lost"), first.log_text()[-3000:]
        assert first.logged("service_stopped_not_active")
        assert int((await js.stream_info("GT_EVT")).state.last_seq) == last_before, "the thawed witness wrote"
        with pytest.raises(nats.js.errors.NotFoundError):
            await js.get_last_msg("GT_EVT", f"gt.evt.cmd.{cmd_id}")

        # Started again (as its supervisor would), a witness takes the key of the dead one at once and settles it.
        third.start()
        await wait_active(pt.nc, "witness", third)
        outcome = await outcome_of(pt.nc, cmd_id, timeout=60)
        assert outcome["type"] == "cmd.accepted"
        assert len((await outcomes(pt.nc))[cmd_id]) == 1
        await check_log(pt.nc, [bead])


# ---- the generic part, on the mayor -------------------------------------------------------------


def mayor_settings(ttl: float) -> ServiceSettings:
    return msgspec.structs.replace(FAST, active_ttl=ttl)


@contextlib.asynccontextmanager
async def running_mayor(town: TownConfig, ttl: float) -> AsyncIterator[tuple[MayorService, asyncio.Task[None]]]:
    mayor = MayorService(town, mayor_settings(ttl))
    task = asyncio.create_task(mayor.run())
    try:
        yield mayor, task
    finally:
        await mayor.shutdown()
        with contextlib.suppress(ActivityLostError):
            await asyncio.wait_for(task, 30)


async def create_bead(nc: Client, title: str) -> dict[str, Any]:
    cmd_id = f"t-{uuid.uuid4().hex[:10]}"
    body = json.dumps({"title": title, "cmd_id": cmd_id}).encode()
    return await send_and_wait(nc, "gt.cmd.bead.create", body, cmd_id)


async def test_a_standby_mayor_follows_answers_status_and_takes_over_a_clean_stop_within_the_margin(
    town: TownConfig, nc: Client, record_property: Any
) -> None:
    ttl = 3.0
    async with running_mayor(town, ttl) as (first, first_task):
        await assert_eventually(first.ready.is_set, timeout=30)
        async with running_mayor(town, ttl) as (second, _task):
            await assert_eventually(second.following.is_set, timeout=30)
            await assert_eventually(lambda: second.role == "standby", timeout=30)
            created = await create_bead(nc, "made while a standby follows")
            assert created["type"] == "cmd.accepted"
            bead = created["result"]["id"]
            await assert_eventually(lambda: bead in second.projection.state.beads, timeout=10)
            status = second.status()
            assert (status.role, status.active_holder, status.caught_up) == ("standby", first.instance, True)
            assert second.intake is None, "a standby takes no commands"
            assert not second.ready.is_set()

            await first.shutdown()
            stopped_at = time.monotonic()
            await asyncio.wait_for(first_task, 30)
            await assert_eventually(second.ready.is_set, timeout=ttl)
            took = time.monotonic() - stopped_at
            print(f"standby mayor took over a clean stop after {took:.2f}s (TTL {ttl:g}s)")
            record_property("takeover_after_clean_stop_s", round(took, 3))
            assert second.role == "active"
            assert (await create_bead(nc, "made by the mayor that took over"))["type"] == "cmd.accepted"
            intake = second.intake
            assert intake is not None
            # Counted once acknowledged, a moment after its outcome is stored.
            await assert_eventually(lambda: intake.processed == 1, timeout=10)


async def test_an_active_mayor_whose_key_another_took_stops_at_once_and_the_next_waits_out_the_ttl(
    town: TownConfig, nc: Client, record_property: Any
) -> None:
    ttl = 3.0
    async with running_mayor(town, ttl) as (mayor, task):
        await assert_eventually(mayor.ready.is_set, timeout=30)
        assert (await create_bead(nc, "before"))["type"] == "cmd.accepted"
        # Someone else (an instance on another machine, by its value) writes the key.
        stranger = Holder(
            identity="mayor",
            instance="9999-abcdef",
            host="elsewhere",
            pid=9999,
            pid_started=0.0,
            ttl_s=ttl,
            since=mayor.clock(),
            renewed_at=mayor.clock(),
        )
        kv = await nc.jetstream().key_value(DEFAULT_ACTIVE_BUCKET)
        await kv.put("mayor", activity.encode(stranger))
        written_at = time.monotonic()
        with pytest.raises(ActivityLostError, match="9999-abcdef"):
            await asyncio.wait_for(task, TIMING.renew_every + 5)
        assert time.monotonic() - written_at < Timing(ttl_s=ttl).renew_every + 3.0
        assert mayor.role == "lost"

    # Nobody settles commands now; a new mayor waits until the stranger's key went unrenewed for its TTL.
    cmd_id = f"t-{uuid.uuid4().hex[:10]}"
    await nc.publish("gt.cmd.bead.create", json.dumps({"title": "waits", "cmd_id": cmd_id}).encode())
    async with running_mayor(town, ttl) as (successor, _task):
        started_at = time.monotonic()
        await assert_eventually(successor.ready.is_set, timeout=ttl + 10)
        waited = time.monotonic() - started_at
        print(f"a new mayor took a foreign key over after {waited:.2f}s (TTL {ttl:g}s)")
        record_property("takeover_of_foreign_key_s", round(waited, 3))
        assert waited >= ttl - 0.5, "it must not take a key it cannot judge dead before the TTL"
        assert (await outcome_of(nc, cmd_id))["type"] == "cmd.accepted"


async def test_an_active_mayor_paused_while_nats_was_frozen_resumes_when_its_key_is_still_its_own(
    own_nats_server: EmbeddedServer, tmp_path: Path, record_property: Any
) -> None:
    """A key nobody can reach (a NATS leader election after a node died takes 4 to 9 s) pauses the holder; it
    must not stop the service: nobody can take the key over without writing it, so a renewal that lands on
    the holder's own revision proves nobody acted meanwhile."""
    ttl = 2.0
    town = TownConfig(nats_url=own_nats_server.url, gt_home=tmp_path / "home")
    server = own_nats_server.proc
    assert server is not None
    async with running_mayor(town, ttl) as (mayor, task), connected(town.nats_url) as client:
        await assert_eventually(mayor.ready.is_set, timeout=30)
        assert (await create_bead(client, "before the freeze"))["type"] == "cmd.accepted"
        holder = await holder_of(client, "mayor")
        assert holder is not None

        server.send_signal(signal.SIGSTOP)
        try:
            await assert_eventually(lambda: mayor.role == "paused", timeout=ttl * 3, interval=0.05)
            # The outage outlasts the whole TTL: a standby could have taken over, had the key been writable.
            await asyncio.sleep(ttl * 1.5)
            assert mayor.role == "paused"
            assert not task.done()
        finally:
            server.send_signal(signal.SIGCONT)

        await assert_eventually(lambda: mayor.role == "active", timeout=ttl * 5, interval=0.05)
        assert not task.done(), "the paused mayor stopped instead of resuming"
        assert (await create_bead(client, "after the freeze"))["type"] == "cmd.accepted"
        after = await holder_of(client, "mayor")
        assert after is not None
        assert (after.instance, after.since) == (holder.instance, holder.since), "it is the same tenure"
