"""Chaos: kill -9 the mayor again and again (and restart NATS once) while 2,000 commands arrive.

Afterwards, from the log alone: every command has exactly one outcome, every accepted create made
exactly one bead and no effect exists without its outcome, and the restarted mayor's projection equals a
fresh replay of the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client

from gt.embedded_nats import EmbeddedServer
from shared.bus.topology import provision
from shared.core.config import TownConfig
from shared.model.events import decode_envelope
from tests.log_tools import assert_live_mayor_matches_replay, read_all

pytestmark = pytest.mark.chaos

COMMANDS = 2000
SEED = int(os.environ.get("GT_CHAOS_SEED", "20261123"))


class MayorProcess:
    """The mayor as a real process that the test kills with SIGKILL and starts again."""

    def __init__(self, env: dict[str, str], url: str, log_path: Path) -> None:
        self.env = {**env, "NATS_URL": url}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills = 0

    def start(self) -> None:
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "services.mayor",
                    "--log-json",
                    "--patrol-interval",
                    "0.5",
                    "--snapshot-every",
                    "300",
                    "--snapshot-check-interval",
                    "0.5",
                ],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.kills += 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


async def publish(nc: Client, subject: str, body: dict[str, Any], msg_id: str | None) -> None:
    """Store one command, retrying through NATS outages; a retry with the same id stores it once."""
    js = nc.jetstream()
    raw = json.dumps(body).encode()
    headers = {"Nats-Msg-Id": msg_id} if msg_id else None
    while True:
        try:
            await js.publish(subject, raw, headers=headers, timeout=2)
        except (TimeoutError, nats.errors.Error, nats.js.errors.ServiceUnavailableError):
            await asyncio.sleep(0.2)
            continue
        return


async def run_chaos(server: EmbeddedServer, env: dict[str, str], tmp_path: Path, *, restart_nats: bool) -> None:
    rng = random.Random(SEED + restart_nats)
    town = TownConfig(nats_url=server.url, gt_home=tmp_path / "home")
    nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    mayor = MayorProcess(env, server.url, tmp_path / "mayor.log")
    try:
        await provision(nc, town)
        mayor.start()
        created: list[str] = []  # bead ids seen in outcomes so far, for closes and claims
        expected: dict[str, str] = {}  # command id -> verb

        async def learn_outcomes() -> None:
            async def on_msg(msg: Any) -> None:
                data = msgspec.json.decode(decode_envelope(msg.data).data)
                if data.get("command") == "bead.create" and "result" in data:
                    created.append(data["result"]["id"])

            await nc.jetstream().subscribe("gt.evt.cmd.>", cb=on_msg, ordered_consumer=True)

        await learn_outcomes()

        async def mayor_serving() -> bool:
            try:
                await nc.request("gt.q.mayor.status", b"{}", timeout=0.5)
            except (TimeoutError, nats.errors.Error):
                return False
            return True

        serving_kills = 0

        async def killer(done: asyncio.Event) -> None:
            # Kill a mayor that got far enough to settle commands, a random while after it did.
            nonlocal serving_kills
            while not done.is_set():
                for _ in range(60):
                    if await mayor_serving() or done.is_set():
                        break
                    await asyncio.sleep(0.05)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), rng.uniform(0.1, 0.8))
                serving_kills += await mayor_serving()
                mayor.kill()
                mayor.start()

        async def nats_restarter() -> None:
            await asyncio.sleep(3)  # the chaos is already running; now take the server away once
            await asyncio.to_thread(server.restart)

        done = asyncio.Event()
        chaos = [asyncio.create_task(killer(done))]
        if restart_nats:
            chaos.append(asyncio.create_task(nats_restarter()))
        for i in range(COMMANDS):
            cmd_id = f"chaos-{i}"
            roll = rng.random()
            body: dict[str, Any]
            if roll < 0.15 and created:
                verb, body = "close", {"id": rng.choice(created)}
            elif roll < 0.25 and created:
                verb, body = "claim", {"id": rng.choice(created), "assignee": rng.choice(["ann", "bob"])}
            else:
                verb, body = "create", {"title": cmd_id, "labels": [f"batch-{i // 100}"]}
            if i % 2:
                await publish(nc, f"gt.cmd.bead.{verb}", body, msg_id=cmd_id)
            else:
                await publish(nc, f"gt.cmd.bead.{verb}", {**body, "cmd_id": cmd_id}, msg_id=None)
            expected[cmd_id] = verb
            if i % 20 == 0:
                await asyncio.sleep(0.1)  # spread the commands over the chaos
        done.set()
        await asyncio.gather(*chaos)
        mayor.kill()
        mayor.start()  # the last restart: it must finish everything the others left

        async def all_answered() -> bool:
            found = {s.removeprefix("gt.evt.cmd.") for _, s, _ in await read_all(nc, town.evt_stream, "gt.evt.cmd.>")}
            return set(expected) <= found

        deadline = asyncio.get_running_loop().time() + 180
        while not await all_answered():
            assert asyncio.get_running_loop().time() < deadline, "not every command got an outcome"
            await asyncio.sleep(0.5)

        log = await read_all(nc, town.evt_stream)
        await check_invariants(nc, log, expected)
        assert serving_kills >= 5, f"only {serving_kills} of {mayor.kills} kills hit a serving mayor"
    finally:
        mayor.stop()
        await nc.close()


async def check_invariants(nc: Client, log: list[tuple[int, str, bytes]], expected: dict[str, str]) -> None:
    envelopes = [(seq, subject, decode_envelope(data)) for seq, subject, data in log]
    seqs = [seq for seq, _, _ in envelopes]
    assert seqs == list(range(1, len(seqs) + 1)), "the log has holes"

    outcomes: dict[str, list[dict[str, Any]]] = {}
    for _, subject, env in envelopes:
        if subject.startswith("gt.evt.cmd."):
            outcomes.setdefault(subject.removeprefix("gt.evt.cmd."), []).append(
                {"type": env.type, **msgspec.json.decode(env.data)}
            )
    duplicates = {cmd: len(found) for cmd, found in outcomes.items() if len(found) != 1}
    assert not duplicates, f"commands with more than one outcome: {duplicates}"
    assert set(outcomes) == set(expected)

    # Every effect is named by exactly one accepted outcome, and every outcome's events exist.
    effect_ids = {env.id: (subject, env) for _, subject, env in envelopes if not subject.startswith("gt.evt.cmd.")}
    named = Counter(ref["id"] for found in outcomes.values() for ref in found[0].get("events", []))
    assert set(named) == set(effect_ids), "effects without an outcome, or outcomes naming missing events"
    assert max(named.values(), default=1) == 1
    for cmd_id, [outcome] in outcomes.items():
        for ref in outcome.get("events", []):
            assert effect_ids[ref["id"]][1].causation_id == cmd_id

    # No bead lost or duplicated: one bead per accepted create, titled by its command.
    creates = [cmd for cmd, verb in expected.items() if verb == "create"]
    assert all(outcomes[cmd][0]["type"] == "cmd.accepted" for cmd in creates)
    created_titles = Counter(
        msgspec.json.decode(env.data)["title"] for _, _, env in envelopes if env.type == "bead.created"
    )
    assert created_titles == Counter(creates)

    # The live projection equals a fresh replay of the same log prefix.
    await assert_live_mayor_matches_replay(nc, len(log))


async def test_kill_9_the_mayor_repeatedly_while_2000_commands_arrive(
    own_nats_server: EmbeddedServer, gt_env: dict[str, str], tmp_path: Path
) -> None:
    await run_chaos(own_nats_server, gt_env, tmp_path, restart_nats=False)


async def test_the_same_with_a_nats_server_restart_in_the_middle(
    own_nats_server: EmbeddedServer, gt_env: dict[str, str], tmp_path: Path
) -> None:
    await run_chaos(own_nats_server, gt_env, tmp_path, restart_nats=True)
