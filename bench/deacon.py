"""(n) detection of a killed service, (o) the deacon's CPU while it keeps many leases.

Everything real: mayor, witness and deacon as their own processes with their default settings (a heartbeat a
second, down after 3 s without one, a check every 0.5 s).

(n): kill -9 of the witness -> the deacon's ``service.down`` event arrives; then the witness is started again
    and its ``service.up`` awaited before the next kill. Ceiling: the staleness threshold itself
    (``GT_SERVICE_STALE_AFTER``): the deacon may not call a service down sooner without false alarms.
(o): N leases are acquired (the deacon records each) and S polecat sessions are in the log (each bead slung
    and claimed, its session requested and started, its hook lease taken, as the witness writes them), then
    during a quiet period the S sessions' hook leases are renewed every second (as their agents' `gt` calls
    do) and the N leases every 10 s (TTL 30 s). The deacon's CPU over the period (liveness, lease expiry and
    stale-hook checks every 0.5 s), against a bare process that only follows the same lease bucket with a KV
    watch and decodes every renewal (what any deacon must at least do).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import psutil

from bench import common as common
from shared.bus import lease_kv as leases
from shared.bus.append import Appender
from shared.bus.connection import Connection
from shared.bus.kv import Bucket
from shared.bus.query import ask_json
from shared.core import subjects
from shared.core.ids import hook_lease_name
from shared.host.tmux import Tmux
from shared.model.commands import LeaseAcquire
from shared.model.decision import NewEvent
from shared.model.events import (
    BeadClaimed,
    BeadCreated,
    BeadSlung,
    Event,
    LeaseAcquired,
    SessionRequested,
    SessionStarted,
    decode_envelope,
)
from shared.model.queries import Status
from shared.service.intake import to_pending

STALE_AFTER_S = 3.0

BARE_WATCHER = """
import asyncio, sys, msgspec, nats
async def main():
    nc = await nats.connect(sys.argv[1])
    kv = await nc.jetstream().key_value("GT_LEASES")
    watcher = await kv.watchall()
    dec = msgspec.json.Decoder()
    async for entry in watcher:
        if entry is not None and entry.value:
            dec.decode(entry.value)
asyncio.run(main())
"""


class ServiceEvents:
    def __init__(self) -> None:
        self.seen: list[tuple[float, str, str]] = []
        """(monotonic arrival, type, instance)."""
        self.changed = asyncio.Event()

    async def subscribe(self, nc: Connection) -> None:
        async def on_msg(msg: Any) -> None:
            env = decode_envelope(msg.data)
            data = msgspec.json.decode(env.data)
            self.seen.append((time.monotonic(), env.type, str(data.get("instance", ""))))
            self.changed.set()

        await nc.subscribe(subjects.event_subject("service", "witness"), cb=on_msg)

    async def next_of(self, kind: str, after: float, timeout: float = 60) -> float:
        async with asyncio.timeout(timeout):
            while True:
                for at, seen_kind, _ in self.seen:
                    if seen_kind == kind and at > after:
                        return at
                self.changed.clear()
                await self.changed.wait()


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


async def _detection(nc: Connection, url: str, env: dict[str, str], kills: int) -> list[float]:
    events = ServiceEvents()
    await events.subscribe(nc)
    latencies = []
    witness = common.start_service("witness", url, env=env)
    try:
        await events.next_of("service.up", 0)
        for _ in range(kills):
            killed_at = time.monotonic()
            witness.kill()
            witness.wait()
            latencies.append(await events.next_of("service.down", killed_at) - killed_at)
            started = time.monotonic()
            witness = common.start_service("witness", url, env=env)
            await events.next_of("service.up", started)
    finally:
        common.stop_service(witness)
    return latencies


def _session_events(i: int, now: datetime) -> list[Event]:
    bead = f"bench-bead-{i}"
    session = f"{bead}-1"
    return [
        BeadCreated(bead_id=bead, title=f"bench work {i}"),
        BeadSlung(bead_id=bead, rig="bench"),
        BeadClaimed(bead_id=bead, assignee=f"bench/p{i}"),
        SessionRequested(
            session_id=session,
            rig="bench",
            polecat=f"p{i}",
            bead=bead,
            worktree=f"/nowhere/bench/polecats/p{i}",
            branch=f"polecat/p{i}/{bead}",
            tmux_name=f"gt-bench-p{i}",
            attempt=1,
        ),
        SessionStarted(session_id=session, pane_pid=1, pid_started=0.0),
        LeaseAcquired(
            lease=hook_lease_name(bead), holder=session, token=1, ttl_s=30.0, expires_at=now + timedelta(seconds=30)
        ),
    ]


async def _sessions(nc: Connection, count: int) -> list[tuple[str, str]]:
    """Write ``count`` started polecat sessions holding their beads' hook leases; (hook lease, session) each."""
    appender = Appender(nc, "GT_EVT")
    now = datetime.now(UTC)
    for i in range(count):
        seen: set[str] = set()
        pending = []
        for event in _session_events(i, now):
            # The first event on each aggregate's subject creates it; the others follow it in the same append.
            subject = f"{event.AGGREGATE}.{event.aggregate_id()}"
            new = NewEvent(payload=event, expected_seq=None if subject in seen else 0)
            seen.add(subject)
            pending.append(to_pending(new, ts=now, actor="witness", causation_id=None, correlation_id=None))
        await appender.append(pending)
    return [(hook_lease_name(f"bench-bead-{i}"), f"bench-bead-{i}-1") for i in range(count)]


async def _leases(
    nc: Connection, url: str, deacon: psutil.Process, count: int, fast: int, quiet_s: float
) -> common.Figure:
    acquires = [LeaseAcquire(lease=f"bench-{i}", holder=f"holder-{i}", ttl_s=30.0) for i in range(count)]
    _, _, outcomes = await common.run_commands(nc, acquires)
    if any(o["type"] != "cmd.accepted" for o in outcomes):
        raise RuntimeError("a lease acquisition was rejected")
    hooks = await _sessions(nc, fast)
    kv = Bucket(nc, "GT_LEASES")
    await kv.open()
    bare = subprocess.Popen([sys.executable, "-c", BARE_WATCHER, url], cwd=common.REPO_ROOT)
    try:
        await asyncio.sleep(2)  # both watchers have read the bucket's current state
        bare_ps = psutil.Process(bare.pid)
        deacon_before, bare_before = cpu_seconds(deacon), cpu_seconds(bare_ps)
        began = time.monotonic()
        tick = 0
        while time.monotonic() - began < quiet_s:
            now = datetime.now(UTC)
            renewals = [leases.renew(kv, lease, session, 1, now) for lease, session in hooks]
            if tick % 10 == 0:
                renewals += [leases.renew(kv, f"bench-{i}", f"holder-{i}", 1, now) for i in range(count)]
            await asyncio.gather(*renewals)
            tick += 1
            await asyncio.sleep(max(0.0, began + tick - time.monotonic()))
        elapsed = time.monotonic() - began
        deacon_cpu = (cpu_seconds(deacon) - deacon_before) / elapsed * 100
        bare_cpu = (cpu_seconds(bare_ps) - bare_before) / elapsed * 100
    finally:
        bare.terminate()
        bare.wait()
    status = await ask_json(nc, Status(service="deacon"), timeout=10)  # with the deacon's own counters
    if status["leases_held"] != count + fast or status["leases_expired"] != 0:
        raise RuntimeError(f"the deacon should hold {count + fast} live leases and expire none: {status}")
    if status["stale_hooks_handed_over"] != 0:
        raise RuntimeError(f"no hook is stale while its session renews it: {status}")
    per_second = count / 10 + fast
    return common.Figure(
        name=f"(o) deacon CPU with {count:,} live leases and {fast} polecat sessions (hooks renewed every second)",
        value=deacon_cpu,
        unit="% of a core",
        ceiling=bare_cpu,
        ceiling_name="a bare KV watch of the lease bucket",
        higher_is_better=False,
        notes=[
            f"about {per_second:,.0f} renewals/s into the bucket over {quiet_s:g} s; none in the log; "
            f"{count + fast:,} held leases and {fast} hooked beads checked every 0.5 s"
        ],
    )


async def run(kills: int = 10, leases_n: int = 1000, fast: int = 200, quiet_s: float = 30.0) -> list[common.Figure]:
    socket = f"gt-bench-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="gt-bench-deacon-") as tmp, common.server() as srv:
        nc, _town = await common.provisioned(srv.url)
        env = {"GT_HOME": str(Path(tmp) / "home"), "GT_TMUX_SOCKET": socket, "GT_WATCHED_SERVICES": "witness"}
        procs = {name: common.start_service(name, srv.url, env=env) for name in ("mayor", "deacon")}
        try:
            for name in procs:
                await common.wait_ready(nc, name)
            latencies = await _detection(nc, srv.url, env, kills)
            cpu = await _leases(nc, srv.url, psutil.Process(procs["deacon"].pid), leases_n, fast, quiet_s)
        finally:
            for proc in procs.values():
                common.stop_service(proc)
            Tmux(socket).kill_server()
            await nc.close()
    figures = [
        common.Figure(
            name=f"(n) kill -9 of a service -> service.down recorded, p50 over {kills} kills",
            value=common.percentile(latencies, 50),
            unit="s",
            ceiling=STALE_AFTER_S,
            ceiling_name="the staleness threshold (a configured wait, not a speed limit: 1.00 is on time)",
            higher_is_better=False,
            notes=["heartbeat 1 s, check every 0.5 s; under `gt up` the supervisor sees the exit within 0.5 s"],
        ),
        common.Figure(
            name=f"(n) kill -9 of a service -> service.down recorded, max over {kills} kills",
            value=max(latencies),
            unit="s",
            ceiling=STALE_AFTER_S,
            ceiling_name="the staleness threshold (a configured wait, not a speed limit: 1.00 is on time)",
            higher_is_better=False,
        ),
        cpu,
    ]
    for figure in figures:
        print(figure.line(), flush=True)
    return figures
