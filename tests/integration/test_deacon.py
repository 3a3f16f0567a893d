"""The deacon with real parts: TTL leases (renewal without log growth, expiry, fencing of a stale holder,
restart mid-TTL) and service liveness from heartbeats (a killed service is down, a restarted one up, a
clean stop is stopped)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, MutableMapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
import structlog
from nats.aio.client import Client

from gt.embedded_nats import EmbeddedServer
from services.deacon.effects import disk_watch
from services.deacon.plan import disk
from services.deacon.service import DeaconService
from services.deacon.settings import DeaconSettings
from services.deacon.state import DiskAlarmState
from services.mayor.service import MayorService
from shared.bus import lease_kv as leases
from shared.bus.kv import Bucket
from shared.bus.lease_kv import LeaseLostError
from shared.core.config import TownConfig
from shared.service import Service, ServiceSettings
from tests.drivers import send_and_wait
from tests.helpers import assert_eventually
from tests.log_tools import events_of
from tests.service_process import ServiceProcess

FAST = ServiceSettings(patrol_interval=0.5, idle_heartbeat=0.5, heartbeat_interval=0.2)
WATCH = DeaconSettings(stale_after_s=1.0, startup_grace_s=30.0, escalate_after_s=600.0, watched=(), tick_s=0.1)


class Town:
    def __init__(self, config: TownConfig, nc: Client) -> None:
        self.config = config
        self.nc = nc
        self.tasks: dict[str, tuple[Service[Any], asyncio.Task[None]]] = {}

    async def start(self, name: str, service: Service[Any]) -> None:
        task = asyncio.create_task(service.run(), name=name)
        await assert_eventually(lambda: service.ready.is_set() or task.done(), timeout=30)
        if task.done():
            task.result()
        self.tasks[name] = (service, task)

    async def stop(self, name: str) -> None:
        service, task = self.tasks.pop(name)
        await service.shutdown()
        await asyncio.wait_for(task, 30)

    def deacon(self) -> DeaconService:
        service = self.tasks["deacon"][0]
        assert isinstance(service, DeaconService)
        return service

    async def command(self, subject: str, **body: Any) -> dict[str, Any]:
        cmd_id = f"t-{uuid.uuid4().hex[:12]}"
        return await send_and_wait(self.nc, subject, json.dumps({**body, "cmd_id": cmd_id}).encode(), cmd_id)


@pytest.fixture
async def dt(town: TownConfig, nc: Client) -> AsyncIterator[Town]:
    handle = Town(town, nc)
    await handle.start("mayor", MayorService(town, FAST))
    await handle.start("deacon", DeaconService(town, FAST, deacon=WATCH))
    try:
        yield handle
    finally:
        for name in list(handle.tasks):
            await handle.stop(name)


async def query(nc: Client, what: str, body: dict[str, Any]) -> Any:
    reply = json.loads((await nc.request(f"gt.q.deacon.{what}", json.dumps(body).encode(), timeout=10)).data)
    assert reply["ok"], reply
    return reply["result"]


async def renew_for(kv: Any, lease: str, holder: str, token: int, times: int) -> None:
    """Renew every 0.2 s, ``times`` times: the holder's side of a lease with a 1 s TTL."""
    for _ in range(times):
        await leases.renew(kv, lease, holder, token, datetime.now(UTC))
        await asyncio.sleep(0.2)


async def test_a_renewed_lease_lives_without_growing_the_log_and_an_unrenewed_one_expires_and_fences(
    dt: Town,
) -> None:
    kv = Bucket(dt.nc, dt.config.lease_bucket)
    got = await dt.command("gt.cmd.lease.acquire", lease="res-1", holder="alice", ttl_s=1.0)
    assert got["type"] == "cmd.accepted", got
    assert got["result"]["token"] == 1
    taken = await dt.command("gt.cmd.lease.acquire", lease="res-1", holder="bob", ttl_s=1.0)
    assert (taken["type"], taken["code"]) == ("cmd.rejected", "conflict")
    assert "held by alice" in taken["message"]

    await renew_for(kv, "res-1", "alice", 1, times=15)  # 3 s: three TTLs
    assert [kind for kind, _ in await events_of(dt.nc, "gt.evt.lease.res-1")] == ["lease.acquired"]
    assert dt.deacon().projection.state.leases.leases["res-1"].status == "held"
    fenced_ok = await dt.command("gt.cmd.bead.create", title="while live", fence={"lease": "res-1", "token": 1})
    assert fenced_ok["type"] == "cmd.accepted", fenced_ok

    async def expired() -> list[tuple[str, dict[str, Any]]]:
        found = await events_of(dt.nc, "gt.evt.lease.res-1")
        assert [kind for kind, _ in found] == ["lease.acquired", "lease.expired"]
        return found

    found: list[tuple[str, dict[str, Any]]] = await assert_eventually(expired, timeout=15)
    assert (found[1][1]["holder"], found[1][1]["token"]) == ("alice", 1)
    with pytest.raises(LeaseLostError, match="the deacon expired it"):
        await leases.renew(kv, "res-1", "alice", 1, datetime.now(UTC))
    stale = await dt.command("gt.cmd.bead.create", title="too late", fence={"lease": "res-1", "token": 1})
    assert (stale["type"], stale["code"]) == ("cmd.rejected", "conflict")
    assert "fenced: token 1 of lease res-1 is not live: it expired" in stale["message"]

    again = await dt.command("gt.cmd.lease.acquire", lease="res-1", holder="bob", ttl_s=60.0)
    assert again["result"]["token"] == 2
    assert (await dt.command("gt.cmd.bead.create", title="bob", fence={"lease": "res-1", "token": 2}))[
        "type"
    ] == "cmd.accepted"
    late = await dt.command("gt.cmd.lease.release", lease="res-1", holder="alice", token=1)
    assert (late["type"], late["code"]) == ("cmd.rejected", "conflict")
    stale_again = await dt.command("gt.cmd.bead.create", title="alice", fence={"lease": "res-1", "token": 1})
    assert "held with token 2 by bob" in stale_again["message"]
    await leases.renew(kv, "res-1", "bob", 2, datetime.now(UTC))
    with pytest.raises(LeaseLostError, match="bob holds it with token 2"):
        await leases.renew(kv, "res-1", "alice", 1, datetime.now(UTC))
    shown = await query(dt.nc, "lease", {"name": "res-1"})
    assert (shown["holder"], shown["token"], shown["status"]) == ("bob", 2, "held")
    released = await dt.command("gt.cmd.lease.release", lease="res-1", holder="bob", token=2)
    assert released["result"]["status"] == "released"
    assert await query(dt.nc, "leases", {"held": True}) == []
    missing = json.loads((await dt.nc.request("gt.q.deacon.lease", b'{"name": "nosuch"}', timeout=5)).data)
    assert (missing["ok"], missing["code"]) == (False, "not_found")
    never = await dt.command("gt.cmd.bead.create", title="x", fence={"lease": "nosuch", "token": 1})
    assert "was never acquired" in never["message"]
    bad = await dt.command("gt.cmd.lease.acquire", lease="res.1", holder="x", ttl_s=0)
    assert (bad["type"], bad["code"]) == ("cmd.rejected", "invalid")


async def test_a_deacon_restarted_mid_ttl_neither_expires_a_renewed_lease_nor_forgets_an_unrenewed_one(
    dt: Town,
) -> None:
    kv = Bucket(dt.nc, dt.config.lease_bucket)
    live = await dt.command("gt.cmd.lease.acquire", lease="kept", holder="h1", ttl_s=1.0)
    lapse = await dt.command("gt.cmd.lease.acquire", lease="lapsed", holder="h2", ttl_s=1.0)
    acquired = time.monotonic()
    assert live["type"] == lapse["type"] == "cmd.accepted"
    renewing = asyncio.create_task(renew_for(kv, "kept", "h1", 1, times=25))
    await dt.stop("deacon")
    # While the deacon is away "lapsed" passes its TTL unrenewed; "kept" is renewed all along.
    # While no deacon runs, "lapsed" passes its TTL unrenewed; "kept" is renewed all along.
    await assert_eventually(lambda: time.monotonic() - acquired > 1.5, timeout=10)
    await dt.start("deacon", DeaconService(dt.config, FAST, deacon=WATCH))

    async def lapsed_expired() -> list[str]:
        kinds = [kind for kind, _ in await events_of(dt.nc, "gt.evt.lease.lapsed")]
        assert kinds == ["lease.acquired", "lease.expired"]
        return kinds

    lapsed: list[str] = await assert_eventually(lapsed_expired, timeout=15)
    assert lapsed[-1] == "lease.expired"
    await renewing
    assert [kind for kind, _ in await events_of(dt.nc, "gt.evt.lease.kept")] == ["lease.acquired"], (
        "renewed across the restart: never expired"
    )

    async def kept_expires_once_renewals_stop() -> list[str]:
        kinds = [kind for kind, _ in await events_of(dt.nc, "gt.evt.lease.kept")]
        assert kinds == ["lease.acquired", "lease.expired"]
        return kinds

    kept: list[str] = await assert_eventually(kept_expires_once_renewals_stop, timeout=15)
    assert kept[-1] == "lease.expired"


async def test_a_killed_service_is_down_a_restarted_one_up_and_a_clean_stop_stopped(
    dt: Town, gt_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**gt_env, "NATS_URL": dt.config.nats_url, "GT_HOME": str(dt.config.gt_home)}
    witness = ServiceProcess("witness", env, tmp_path / "witness.log")
    witness.start()
    try:
        deacon = dt.deacon()

        def status() -> str:
            life = deacon.projection.state.liveness.services.get("witness")
            return life.status if life else "unknown"

        await assert_eventually(lambda: status() == "up", timeout=60, message="the witness is seen up")
        first = deacon.projection.state.liveness.services["witness"].instance
        assert deacon.projection.state.liveness.services["mayor"].status == "up", "the in-process mayor beats too"
        witness.kill()
        await assert_eventually(lambda: status() == "down", timeout=30)
        down = [d for kind, d in await events_of(dt.nc, "gt.evt.service.witness") if kind == "service.down"]
        assert len(down) == 1
        assert down[0]["instance"] == first
        assert down[0]["reason"].startswith("no heartbeat for ")
        witness.start()
        await assert_eventually(lambda: status() == "up", timeout=60)
        assert deacon.projection.state.liveness.services["witness"].instance != first, "a new process"
        witness.stop()
        await assert_eventually(lambda: status() == "stopped", timeout=30)
        kinds = [kind for kind, _ in await events_of(dt.nc, "gt.evt.service.witness")]
        assert kinds == ["service.up", "service.down", "service.up", "service.stopped"]
        listed = {row["service"]: row for row in await query(dt.nc, "services", {})}
        assert (listed["witness"]["status"], listed["mayor"]["status"]) == ("stopped", "up")
    finally:
        with contextlib.suppress(Exception):
            witness.kill()


async def test_a_service_down_long_enough_is_escalated_and_the_escalation_closes_once_it_is_up(
    town: TownConfig, nc: Client, gt_env: dict[str, str], tmp_path: Path
) -> None:
    handle = Town(town, nc)
    mayor = MayorService(town, FAST)
    await handle.start("mayor", mayor)
    await handle.start("deacon", DeaconService(town, FAST, deacon=msgspec.structs.replace(WATCH, escalate_after_s=1.0)))
    env = {**gt_env, "NATS_URL": town.nats_url, "GT_HOME": str(town.gt_home)}
    witness = ServiceProcess("witness", env, tmp_path / "witness.log")
    witness.start()
    try:
        deacon = handle.deacon()

        def status() -> str:
            life = deacon.projection.state.liveness.services.get("witness")
            return life.status if life else "unknown"

        await assert_eventually(lambda: status() == "up", timeout=60, message="the witness is seen up")
        witness.kill()

        def raised() -> Any:
            found = [e for e in mayor.projection.state.escalations.values() if e.source == "deacon/witness"]
            assert found, "not escalated yet"
            return found[0]

        escalation = await assert_eventually(raised, timeout=30)
        assert escalation.resolved_when == ["service:witness"]
        assert escalation.status == "open", "down: nothing resolved it"
        witness.start()
        await assert_eventually(lambda: status() == "up", timeout=60)

        def closed() -> Any:
            found = mayor.projection.state.escalations[escalation.id]
            assert found.status == "closed", "still open"
            return found

        done = await assert_eventually(closed, timeout=30)
        assert (done.closed_by, done.close_reason) == ("mayor", "resolved: service witness is up again")
    finally:
        with contextlib.suppress(Exception):
            witness.kill()
        for name in list(handle.tasks):
            await handle.stop(name)


async def test_low_disk_space_raises_one_escalation_and_closes_it_once_space_is_back(
    town: TownConfig, nc: Client, tmp_path: Path
) -> None:
    # No disk to fill: an alarm threshold of 100% free makes the test's own volume "low".
    low = msgspec.structs.replace(WATCH, disk_low_percent=100.0, disk_paths=(str(tmp_path),), disk_check_s=0.1)
    handle = Town(town, nc)
    await handle.start("mayor", MayorService(town, FAST))
    await handle.start("deacon", DeaconService(town, FAST, deacon=low))
    try:

        async def disk_escalations() -> list[tuple[str, dict[str, Any]]]:
            found = await events_of(nc, "gt.evt.escalation.>")
            raised = {
                d["escalation_id"] for kind, d in found if kind == "escalation.raised" and d["source"] == "deacon/disk"
            }
            return [(kind, d) for kind, d in found if d["escalation_id"] in raised]

        async def raised() -> list[tuple[str, dict[str, Any]]]:
            return [(kind, d) for kind, d in await disk_escalations() if kind == "escalation.raised"]

        first: list[tuple[str, dict[str, Any]]] = await assert_eventually(
            raised, timeout=30, message="a low disk is escalated"
        )
        assert first[0][1]["severity"] == "high"
        assert f"the volume of {tmp_path}" in first[0][1]["message"]
        assert "GT_DISK_LOW_PERCENT" in first[0][1]["message"]
        # Checked again and again, by this deacon and by a restarted one: still the one escalation.
        checks = handle.deacon().disk_checks
        await assert_eventually(lambda: handle.deacon().disk_checks >= checks + 5, timeout=30)
        await handle.stop("deacon")
        await handle.start("deacon", DeaconService(town, FAST, deacon=low))
        await assert_eventually(lambda: handle.deacon().disk_checks >= 5, timeout=30)
        assert len(await raised()) == 1

        # Space is back (here: the alarm's threshold lowered under what is free): the escalation is closed.
        deacon = handle.deacon()
        deacon.watch = msgspec.structs.replace(low, disk_low_percent=0.001)

        async def closed() -> bool:
            return any(kind == "escalation.closed" for kind, _ in await disk_escalations())

        done: bool = await assert_eventually(
            closed, timeout=30, message="the disk escalation is closed once space is back"
        )
        assert done
        kinds = [kind for kind, _ in await disk_escalations()]
        assert kinds == ["escalation.raised", "escalation.closed"]
        assert deacon.projection.state.disk.open is None
    finally:
        for name in list(handle.tasks):
            await handle.stop(name)


async def test_the_disk_alarm_reads_what_is_left_of_the_accounts_jetstream_storage_limit(tmp_path: Path) -> None:
    accounts = tmp_path / "limited.conf"
    accounts.write_text(
        "accounts { GT { jetstream { max_file: 1M, max_mem: 1M }\n users: [ { user: deacon, password: pw } ] } }\n"
    )
    server = EmbeddedServer(tmp_path / "nats", include=accounts)
    server.start()
    try:
        nc = await nats.connect(server.url, user="deacon", password="pw")
        try:
            js = nc.jetstream()
            await js.add_stream(name="FILL", subjects=["fill.>"])
            for i in range(6):
                await js.publish(f"fill.{i}", b"x" * 100_000)
            seen = await disk_watch.measure(nc, (str(tmp_path),))
        finally:
            await nc.close()
    finally:
        server.kill()
    by_what = {m.what: m for m in seen}
    assert set(by_what) == {f"the volume of {tmp_path}", "the NATS account's JetStream storage"}
    account = by_what["the NATS account's JetStream storage"]
    assert 30.0 < account.free_percent < 50.0, account  # 600 kB of 1 MiB used
    assert disk.plan(DiskAlarmState(), seen, 50.0) is not None, "under 50% free: an alarm"


async def test_by_default_the_disk_alarm_watches_gt_home_and_the_nats_store_gt_up_keeps_in_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = EmbeddedServer(home / "nats")  # where `gt up` runs its server (gt/town/): store nats/jetstream
    server.start()
    town = TownConfig(nats_url=server.url, gt_home=home)
    # As `gt up` starts it: no GT_DISK_WATCH. No disk to fill: at 100% the test's own volume is "low".
    low = msgspec.structs.replace(WATCH, disk_low_percent=100.0, disk_check_s=0.1)
    assert low.disk_paths is None
    try:
        nc = await nats.connect(server.url)
        handle = Town(town, nc)
        try:
            await handle.start("mayor", MayorService(town, FAST))
            await handle.start("deacon", DeaconService(town, FAST, deacon=low))
            deacon = handle.deacon()
            assert deacon.disk_paths() == (str(home), str(server.store_dir))

            async def raised() -> list[dict[str, Any]]:
                found = await events_of(nc, "gt.evt.escalation.>")
                return [d for kind, d in found if kind == "escalation.raised" and d["source"] == "deacon/disk"]

            escalations: list[dict[str, Any]] = await assert_eventually(
                raised, timeout=30, message="the volume of GT_HOME is watched by default"
            )
            assert f"the volume of {home} has" in escalations[0]["message"]
            # GT_HOME and the store are one volume here: measured once, under GT_HOME's name.
            seen = await disk_watch.measure(nc, deacon.disk_paths())
            assert [m.what for m in seen] == [f"the volume of {home}"]
        finally:
            for name in list(handle.tasks):
                await handle.stop(name)
            await nc.close()
    finally:
        server.kill()


async def test_a_missing_watched_path_is_said_once_and_again_only_when_that_changes(
    town: TownConfig, nc: Client, tmp_path: Path
) -> None:
    missing = tmp_path / "home"  # named in GT_DISK_WATCH, never created (a recipe that forgot its mkdir)
    watch = msgspec.structs.replace(
        WATCH, disk_low_percent=0.001, disk_paths=(str(missing), str(tmp_path)), disk_check_s=0.05
    )
    handle = Town(town, nc)
    with structlog.testing.capture_logs() as logs:
        await handle.start("mayor", MayorService(town, FAST))
        await handle.start("deacon", DeaconService(town, FAST, deacon=watch))
        try:
            deacon = handle.deacon()

            def said(event: str) -> list[MutableMapping[str, Any]]:
                return [e for e in logs if e["event"] == event and e.get("path") == str(missing)]

            await assert_eventually(lambda: deacon.disk_checks >= 10, timeout=30)
            unreadable = said("disk_watch_unreadable")
            assert len(unreadable) == 1, "said once, not at every check"
            assert "FileNotFoundError" in unreadable[0]["error"]
            assert "GT_DISK_WATCH" in unreadable[0]["hint"]

            missing.mkdir()
            await assert_eventually(lambda: said("disk_watch_readable"), timeout=30)
            missing.rmdir()
            await assert_eventually(lambda: len(said("disk_watch_unreadable")) == 2, timeout=30)
            checks = deacon.disk_checks
            await assert_eventually(lambda: deacon.disk_checks >= checks + 10, timeout=30)
            assert len(said("disk_watch_unreadable")) == 2, "gone again: said again, once"
            assert len(said("disk_watch_readable")) == 1
        finally:
            for name in list(handle.tasks):
                await handle.stop(name)
