"""Garbage collection with real parts: a town works a bead to closed (real tmux, git and the reference agent),
then `gt gc --ttl 0` sweeps. What finished leaves every projection, live work stays, each projection equals a
fresh replay of the log, snapshots are replaced by compacted ones (and restarted services load them), and the
deacon purges the KV entries of dead things. Automatic sweeps: two deacons, one sweep per interval."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js.client import JetStreamContext

from services.deacon.projection import new_projection as deacon_projection
from services.deacon.service import DeaconService
from services.deacon.settings import DeaconSettings
from services.mayor.projection import new_projection as mayor_projection
from services.mayor.service import MayorService
from services.refinery.projection import new_projection as refinery_projection
from services.refinery.service import RefineryService
from services.witness.projection import collectable
from services.witness.projection import new_projection as witness_projection
from services.witness.settings import WitnessSettings
from shared.bus import lease_kv as leases
from shared.bus.kv import Bucket
from shared.bus.snapshots import SnapshotStore
from shared.core.config import TownConfig
from shared.model import heartbeats
from shared.service import Service
from shared.service.projection import Projection
from tests.helpers import assert_eventually, gt_run
from tests.log_tools import events_of, fresh_replay
from tests.witness_town import FAST, PolecatTown, polecat_town

WATCH = DeaconSettings(
    stale_after_s=3600.0, startup_grace_s=3600.0, escalate_after_s=3600.0, watched=(), tick_s=0.1, gc_interval_s=0.0
)
WITNESS = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0)
FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)


@contextlib.asynccontextmanager
async def running(service: Service[Any], *, active: bool = True) -> AsyncIterator[Service[Any]]:
    """The service running; until it is the active one (else only until it follows the log: a standby)."""
    task = asyncio.create_task(service.run(), name=service.name)
    started = service.ready if active else service.following
    try:
        await assert_eventually(lambda: started.is_set() or task.done(), timeout=30)
        if task.done():
            task.result()
        yield service
    finally:
        await service.shutdown()
        await asyncio.wait_for(task, 30)


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    async with polecat_town(town, nc, tmp_path, WITNESS) as handle:
        yield handle


async def assert_replays(nc: Client, service: Service[Any], make: Callable[[], Projection[Any]]) -> None:
    """The live projection equals a fresh projection fed the stream up to the same sequence."""
    seq, live = service.projection.last_seq, service.projection.serialize_state()
    fresh = await fresh_replay(nc, make(), upto=seq)
    assert fresh.serialize_state() == live, f"{service.name}: the live projection differs from a fresh replay"


async def snapshot_size(nc: Client, config: TownConfig, name: str) -> int:
    data = await SnapshotStore(nc, config.snapshot_bucket).load(name)
    assert data is not None, f"no snapshot of the {name}"
    return len(data)


async def kv_keys(js: JetStreamContext, bucket: str) -> set[str]:
    kv = await js.key_value(bucket)
    try:
        return set(await kv.keys())
    except nats.js.errors.NoKeysError:
        return set()


def run_gt(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return gt_run(env, *args, timeout=60)


async def test_a_sweep_collects_what_finished_keeps_live_work_compacts_snapshots_and_purges_dead_kv_entries(
    pt: PolecatTown, town: TownConfig, nc: Client, gt_env: dict[str, str]
) -> None:
    js = nc.jetstream()
    async with running(DeaconService(town, FAST, deacon=WATCH)) as running_deacon:
        deacon = running_deacon
        assert isinstance(deacon, DeaconService)
        assert pt.mayor is not None
        assert pt.witness is not None
        assert pt.refinery is not None

        # Work that finishes: worked by the reference agent, merged, closed, its session cleaned up.
        await pt.add_rig()
        done = await pt.new_bead("Add a greeting")
        await pt.sling(done)
        mr = (await pt.wait_merge_requested(done))["id"]
        done_sessions = [s.id for s in await pt.wait_settled(done)]

        def finished() -> bool:
            assert pt.mayor is not None
            assert pt.witness is not None
            assert pt.refinery is not None
            assert pt.mayor.projection.state.beads[done].status == "closed"
            assert pt.refinery.projection.state.mrs[mr].status == "merged"
            w = pt.witness.state
            latest = {(s.rig, s.polecat): s.id for s in w.sessions.values()}
            assert collectable(w, w.beads[done], FAR_FUTURE, latest), "the witness still has something to do"
            return True

        await assert_eventually(finished, timeout=60)

        # Live work: hooked on a rig whose agent hangs, so its session stays started.
        await pt.add_rig("slow", agent_command="GT_AGENT_FAULT=hang gt-agent")
        live = await pt.new_bead("Still being worked on")
        await pt.sling(live, rig="slow")

        def started() -> list[str]:
            sessions = pt.sessions_of(live)
            assert sessions, "no session yet"
            assert sessions[-1].status == "started"
            return [s.id for s in sessions]

        live_sessions: list[str] = await assert_eventually(started, timeout=60)

        # KV entries: a released lease and a held one, an old and a fresh agent heartbeat, a stopped service.
        lease_kv = Bucket(nc, town.lease_bucket)
        for name in ("res-old", "res-live"):
            got = await pt.ok("gt.cmd.lease.acquire", lease=name, holder="alice", ttl_s=3600.0)
            await leases.renew(lease_kv, name, "alice", int(got["token"]), datetime.now(UTC))
        await pt.ok("gt.cmd.lease.release", lease="res-old", holder="alice", token=1)
        beats = await js.key_value(town.heartbeat_bucket)
        old_beat = {"ts": "2020-01-01T00:00:00+00:00", "session": "ghost-1", "note": ""}
        await beats.put("ghost-1", json.dumps(old_beat).encode())
        future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
        await beats.put("future-1", json.dumps({"ts": future, "session": "future-1", "note": ""}).encode())
        stopped_at = datetime(2020, 1, 1, tzinfo=UTC)
        ghost = heartbeats.ServiceHeartbeat(
            service="ghost", instance="1-old", pid=1, host="h", started_at=stopped_at, ts=stopped_at, stopping=True
        )
        services_kv = await js.key_value(town.service_bucket)
        await services_kv.put(heartbeats.key_of("ghost", "1-old"), heartbeats.encode(ghost))

        collected: list[Service[Any]] = [pt.mayor, pt.witness, pt.refinery]
        for service in collected:
            await service.save_snapshot()
        before = {s.name: await snapshot_size(nc, town, s.name) for s in collected}

        # The sweep, as an operator asks for it.
        out = await asyncio.to_thread(run_gt, {**gt_env, "NATS_URL": town.nats_url}, "gc", "--ttl", "0", "--json")
        assert out.returncode == 0, out.stderr
        outcome = json.loads(out.stdout)
        assert outcome["type"] == "cmd.accepted", outcome
        assert outcome["data"]["result"]["ttl_s"] == 0.0
        assert outcome["data"]["result"]["changed"] is True
        assert [kind for kind, _ in await events_of(nc, "gt.evt.gc.town")] == ["gc.swept"]
        await assert_eventually(lambda: deacon.projection.state.gc.sweeps == 1)
        sweep_seq = deacon.projection.state.gc.version
        for service in (*collected, deacon):
            await assert_eventually(lambda s=service: s.projection.last_seq >= sweep_seq)  # type: ignore[misc]

        # Gone from the projections: the finished bead's molecule, sessions, merge request.
        mayor_state = pt.mayor.projection.state
        assert done not in mayor_state.molecules
        assert mayor_state.beads[done].collected_molecule == "polecat-work"
        assert done not in pt.witness.state.beads
        assert not set(done_sessions) & set(pt.witness.state.sessions)
        assert mr not in pt.witness.state.mr_beads
        assert mr not in pt.refinery.projection.state.mrs
        # Live work untouched.
        assert live in mayor_state.molecules
        assert live in pt.witness.state.beads
        assert set(live_sessions) <= set(pt.witness.state.sessions)
        assert pt.witness.state.beads[live].sessions[: len(live_sessions)] == live_sessions
        assert {"res-old", "res-live"} <= set(deacon.projection.state.leases.leases)  # lease records stay

        # Queries still answer, and say what was collected.
        shown = await asyncio.to_thread(run_gt, {**gt_env, "NATS_URL": town.nats_url}, "bead", "show", done, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["collected_molecule"] == "polecat-work"
        mol = await asyncio.to_thread(run_gt, {**gt_env, "NATS_URL": town.nats_url}, "mol", "status", done)
        assert mol.returncode != 0
        assert "molecule was garbage-collected" in mol.stderr
        step = await pt.command("gt.cmd.step.done", bead=done, step="implement")
        assert (step["type"], step["code"]) == ("cmd.rejected", "conflict")
        assert "garbage-collected" in step["message"]
        reply = json.loads((await nc.request("gt.q.refinery.mr", json.dumps({"id": mr}).encode(), timeout=10)).data)
        assert (reply["ok"], reply["code"]) == (False, "not_found")

        # Every projection equals a fresh replay of the whole stream.
        makers: list[tuple[Service[Any], Callable[[], Projection[Any]]]] = [
            (pt.mayor, mayor_projection),
            (pt.witness, witness_projection),
            (pt.refinery, refinery_projection),
            (deacon, deacon_projection),
        ]
        for service, make in makers:
            await assert_replays(nc, service, make)

        # Compacted snapshots replace the old ones promptly, and nothing of the old ones is left in the store.
        for service in (*collected, deacon):
            await assert_eventually(lambda s=service: s.status().snapshot_seq >= sweep_seq)  # type: ignore[misc]
        after = {s.name: await snapshot_size(nc, town, s.name) for s in collected}
        for name, size in after.items():
            assert size < before[name], f"the {name}'s snapshot did not shrink: {before[name]} -> {size}"
        store = await js.object_store(town.snapshot_bucket)
        objects = await store.list()
        assert sorted(o.name for o in objects) == ["deacon", "mayor", "refinery", "witness"]
        stream = await js.stream_info(f"OBJ_{town.snapshot_bucket}")
        assert stream.state.messages == sum((o.chunks or 0) + 1 for o in objects)  # each one's chunks and meta

        # The KV entries of dead things are purged; live ones stay.
        await assert_eventually(lambda: deacon.kv_swept_seq >= sweep_seq)
        assert deacon.kv_purged.leases >= 1
        assert deacon.kv_purged.heartbeats >= 1
        assert deacon.kv_purged.services == 1
        lease_keys = await kv_keys(js, town.lease_bucket)
        assert "res-old" not in lease_keys
        assert "res-live" in lease_keys
        beat_keys = await kv_keys(js, town.heartbeat_bucket)
        assert "ghost-1" not in beat_keys
        assert "future-1" in beat_keys
        service_keys = await kv_keys(js, town.service_bucket)
        assert heartbeats.key_of("ghost", "1-old") not in service_keys
        assert heartbeats.key_of("mayor", pt.mayor.instance) in service_keys

        # Restarted services load the compacted snapshot and still equal a fresh replay.
        await pt.stop("mayor")
        pt.mayor = MayorService(town, FAST)
        await pt.start("mayor", pt.mayor)
        await pt.stop("refinery")
        pt.refinery = RefineryService(town, FAST)
        await pt.start("refinery", pt.refinery)
        await pt.stop("witness")
        await pt.start_witness(WITNESS)
        assert pt.witness is not None
        restarted: list[tuple[Service[Any], Callable[[], Projection[Any]]]] = [
            (pt.mayor, mayor_projection),
            (pt.witness, witness_projection),
            (pt.refinery, refinery_projection),
        ]
        for service, make in restarted:
            status = service.status()
            assert status.snapshot_seq >= sweep_seq, f"the {service.name} did not start from the compacted one"
            assert service.projection.applied < service.projection.last_seq  # only the tail was replayed
            await assert_replays(nc, service, make)
        assert done not in pt.mayor.projection.state.molecules
        assert live in pt.mayor.projection.state.molecules
        assert done not in pt.witness.state.beads
        assert mr not in pt.refinery.projection.state.mrs


async def test_two_deacons_sweep_once_per_interval(town: TownConfig, nc: Client) -> None:
    now = [datetime.now(UTC)]

    def clock() -> datetime:
        return now[0]

    settings = msgspec.structs.replace(WATCH, gc_interval_s=60.0, gc_ttl_s=3600.0)
    one = DeaconService(town, FAST, deacon=settings, clock=clock)
    two = DeaconService(town, FAST, deacon=settings, clock=clock)

    async def swept() -> list[dict[str, Any]]:
        return [data for _kind, data in await events_of(nc, "gt.evt.gc.town")]

    async def settled(count: int) -> list[dict[str, Any]]:
        """Both deacons applied ``count`` sweeps and the active one looked a few more times at the same clock
        (the other stands by: it follows the log but does not watch): still ``count``."""
        await assert_eventually(lambda: one.projection.state.gc.sweeps >= count)
        await assert_eventually(lambda: two.projection.state.gc.sweeps >= count)
        await assert_eventually(lambda: sorted((one.role, two.role)) == ["active", "standby"])
        active = one if one.role == "active" else two
        mark = active.gc_checks
        await assert_eventually(lambda: active.gc_checks >= mark + 5)
        found = await swept()
        assert len(found) == count, found
        return found

    async with running(one), running(two, active=False):
        await settled(0)  # a town that never swept waits one interval after the deacons began watching
        now[0] += timedelta(seconds=60)
        first = (await settled(1))[0]
        assert datetime.fromisoformat(first["cutoff"]) == now[0] - timedelta(hours=1)
        assert first["ttl_s"] == 3600.0
        now[0] += timedelta(seconds=59)
        await settled(1)  # not due yet
        now[0] += timedelta(seconds=1)
        second = (await settled(2))[1]
        assert datetime.fromisoformat(second["cutoff"]) == now[0] - timedelta(hours=1)
