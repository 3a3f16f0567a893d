"""Chaos: kill -9 the mayor while 200 beads with molecules are slung and stepped through and 20 convoys fill.

Afterwards, from the log alone: every convoy closed exactly once, every step done exactly once, every
molecule completed once, every bead closed once, every command answered once, and the restarted mayor's
projection equals a fresh replay.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.errors
import pytest
from nats.aio.client import Client

from gt.embedded_nats import EmbeddedServer
from shared.bus.topology import provision
from shared.core.config import TownConfig
from shared.model.events import decode_envelope
from tests.chaos.test_mayor_chaos import MayorProcess, publish
from tests.helpers import assert_eventually
from tests.log_tools import assert_live_mayor_matches_replay, read_all, seed_rigs

pytestmark = pytest.mark.chaos

CONVOYS = 20
BEADS_PER_CONVOY = 10
STEPS = ["load-context", "implement", "commit", "self-review", "run-tests", "submit"]
SEED = int(os.environ.get("GT_CHAOS_SEED", "20261124"))


class Worker:
    """Fills one convoy with beads, then slings, steps and closes each of them, one command at a time."""

    def __init__(self, nc: Client, index: int, sent: Counter[str], rng: random.Random) -> None:
        self.nc = nc
        self.index = index
        self.sent = sent
        self.counter = 0
        self.rng = rng

    async def command(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        # An agent works a while between two commands; it also spreads the workload over the kills.
        await asyncio.sleep(self.rng.uniform(0.02, 0.15))
        self.counter += 1
        cmd_id = f"w{self.index}-{self.counter}"
        raw = json.dumps({**body, "cmd_id": cmd_id}).encode()
        # Stored in GT_CMD whatever the mayor's state; the outcome comes once some mayor settles it.
        await publish(self.nc, subject, json.loads(raw), msg_id=cmd_id)
        self.sent[cmd_id] += 1
        outcome = await send_and_wait_for_stored(self.nc, cmd_id)
        assert outcome["type"] == "cmd.accepted", (subject, body, outcome)
        result: dict[str, Any] = outcome["result"]
        return result

    async def run(self) -> None:
        beads = []
        for i in range(BEADS_PER_CONVOY):
            result = await self.command("gt.cmd.bead.create", {"title": f"convoy {self.index} bead {i}"})
            beads.append(result["id"])
            if i == 0:
                convoy = (await self.command("gt.cmd.convoy.create", {"title": f"Batch {self.index}", "beads": beads}))[
                    "id"
                ]
            else:
                await self.command("gt.cmd.convoy.add", {"id": convoy, "beads": [result["id"]]})
        for bead_id in beads:
            await self.command("gt.cmd.bead.sling", {"id": bead_id, "rig": f"rig{self.index % 3}"})
            for step in STEPS:
                await self.command("gt.cmd.step.done", {"bead": bead_id, "step": step})
            await self.command("gt.cmd.bead.close", {"id": bead_id, "reason": "merged"})


async def send_and_wait_for_stored(nc: Client, cmd_id: str, *, timeout: float = 240) -> dict[str, Any]:
    js = nc.jetstream()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.01
    while True:
        try:
            msg = await js.get_last_msg("GT_EVT", f"gt.evt.cmd.{cmd_id}")
        except (TimeoutError, nats.errors.Error):
            assert loop.time() < deadline, f"no outcome for {cmd_id}"
            await asyncio.sleep(delay)
            delay = min(0.25, delay * 2)
            continue
        env = decode_envelope(msg.data or b"")
        return {"type": env.type, **msgspec.json.decode(env.data)}


async def test_kill_9_the_mayor_while_molecules_are_stepped_and_convoys_fill(
    own_nats_server: EmbeddedServer, gt_env: dict[str, str], tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    town = TownConfig(nats_url=own_nats_server.url, gt_home=tmp_path / "home")
    nc = await nats.connect(own_nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    mayor = MayorProcess(gt_env, own_nats_server.url, tmp_path / "mayor.log")
    sent: Counter[str] = Counter()
    try:
        await provision(nc, town)
        await seed_rigs(nc, *(f"rig{i}" for i in range(3)))  # the rigs the workers sling to
        mayor.start()
        workers = [asyncio.create_task(Worker(nc, i, sent, random.Random(SEED + i)).run()) for i in range(CONVOYS)]
        serving_kills = 0
        work = asyncio.gather(*workers)

        async def serving() -> bool:
            try:
                await nc.request("gt.q.mayor.status", b"{}", timeout=0.5)
            except (TimeoutError, nats.errors.Error):
                return False
            return True

        while not work.done():
            # Let the restarted mayor come up and settle commands a random while, then kill it: a kill that
            # only ever hits a mayor still starting would prove little.
            for _ in range(60):
                if work.done() or await serving():
                    break
                await asyncio.sleep(0.05)
            await asyncio.wait({work}, timeout=rng.uniform(0.5, 2.0))
            if work.done():
                break
            serving_kills += await serving()
            mayor.kill()
            mayor.start()
        await work  # re-raises a worker's failure
        assert serving_kills >= 5, f"only {serving_kills} kills hit a serving mayor"
        mayor.kill()
        mayor.start()  # one more restart: it must find nothing left to do twice

        # Convoys close by the mayor's reconcile once their last bead closed: a kill just after the last close
        # leaves that to the restarted mayor's first patrols.
        async def every_convoy_closed() -> list[tuple[int, str, bytes]]:
            log = await read_all(nc, town.evt_stream)
            kinds = [(subject, decode_envelope(data).type) for _, subject, data in log]
            created = {s for s, t in kinds if t == "convoy.created"}
            closed = {s for s, t in kinds if t == "convoy.closed"}
            assert created == closed, f"{len(created - closed)} convoys not closed yet"
            return log

        log: list[tuple[int, str, bytes]] = await assert_eventually(every_convoy_closed, timeout=60, interval=0.5)
        await _check(nc, log, sent)
    finally:
        mayor.stop()
        await nc.close()


async def _check(nc: Client, log: list[tuple[int, str, bytes]], sent: Counter[str]) -> None:
    events = [(subject, decode_envelope(data)) for _, subject, data in log]
    payloads = [(env.type, msgspec.json.decode(env.data)) for _, env in events]

    outcomes = Counter(subject for subject, _ in events if subject.startswith("gt.evt.cmd."))
    assert set(outcomes) == {f"gt.evt.cmd.{cmd}" for cmd in sent}
    assert max(outcomes.values()) == 1, "a command with two outcomes"

    created_convoys = {p["convoy_id"] for t, p in payloads if t == "convoy.created"}
    closed_convoys = Counter(p["convoy_id"] for t, p in payloads if t == "convoy.closed")
    assert len(created_convoys) == CONVOYS * (BEADS_PER_CONVOY + 1)  # 20 filled + one auto-convoy per sling
    assert set(closed_convoys) == created_convoys, "a convoy that never closed"
    assert max(closed_convoys.values()) == 1, "a convoy closed twice"

    beads = {p["bead_id"] for t, p in payloads if t == "bead.created"}
    assert len(beads) == CONVOYS * BEADS_PER_CONVOY
    done = Counter((p["bead_id"], p["step"]) for t, p in payloads if t == "step.done")
    assert set(done) == {(b, s) for b in beads for s in STEPS}, "a step never done"
    assert max(done.values()) == 1, "a step done twice"
    completed = Counter(p["bead_id"] for t, p in payloads if t == "molecule.completed")
    assert completed == Counter(beads)
    closed = Counter(p["bead_id"] for t, p in payloads if t == "bead.closed")
    assert closed == Counter(beads)

    # The restarted mayor's projection equals a fresh replay of the same log prefix.
    replayed = await assert_live_mayor_matches_replay(nc, len(log))
    state = replayed.state
    assert all(c.status == "closed" for c in state.convoys.values())
    assert all(m.completed_at is not None for m in state.molecules.values())
