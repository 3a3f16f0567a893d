"""An agent's reads outlast a restart of the service they ask (gt/cli/common.py ``read``): inside a polecat
session, a query nobody answers (the service not running) is asked again for as long as the session's login
would wait (``GT_TOWN_PATIENCE``, gt/cli/patience.py); outside one, it fails at once, as an operator wants to know."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.aio.client import Client

from gt.cli.common import EXIT_UNREACHABLE
from shared.bus.kv import Bucket
from shared.bus.query import ask_json
from shared.bus.topology import provision
from shared.core.config import TownConfig
from shared.core.errors import QueryError
from shared.model import heartbeats
from shared.model.queries import mayor
from tests.integration.test_cli import Gt
from tests.integration.test_cli import gt as gt
from tests.integration.test_mayor_service import run_mayor

SESSION_ENV = {"GT_RIG": "demo", "GT_POLECAT": "ace", "GT_SESSION": "hq-000001-1"}
DOWN_FOR_S = 2.0


async def test_a_patient_query_is_answered_once_its_service_is_back(nc: Client, town: TownConfig) -> None:
    await provision(nc, town)
    started = time.monotonic()
    with pytest.raises(QueryError) as refused:
        await ask_json(nc, mayor.Beads())
    assert refused.value.code == "unavailable", refused.value
    assert time.monotonic() - started < DOWN_FOR_S, "an impatient query fails at once"
    asking = asyncio.create_task(ask_json(nc, mayor.Beads(), patience_s=60))
    await asyncio.sleep(DOWN_FOR_S)
    assert not asking.done(), "still waiting while the mayor is down"
    async with run_mayor(town, rigs=()):
        assert await asyncio.wait_for(asking, 30) == []


async def test_an_agents_read_waits_out_a_restart_and_an_operators_does_not(
    nc: Client, gt: Gt, town: TownConfig
) -> None:
    await provision(nc, town)
    operator = await gt("bead", "list")
    assert operator.code == EXIT_UNREACHABLE, operator
    assert "the mayor is not running" in operator.err
    agent = Gt({**gt.env, **SESSION_ENV}, town)
    reading = asyncio.create_task(agent("bead", "list", "--json"))
    await asyncio.sleep(DOWN_FOR_S)
    assert not reading.done(), reading
    async with run_mayor(town, rigs=()):
        read = await asyncio.wait_for(reading, 60)
    assert read.code == 0, read
    assert read.json() == []


async def test_an_agent_waiting_for_the_town_keeps_its_heartbeat_fresh(nc: Client, gt: Gt, town: TownConfig) -> None:
    # Waiting is not stalling: the witness reads the session's heartbeat, which its `gt` renews while it waits.
    await provision(nc, town)
    agent = Gt({**gt.env, **SESSION_ENV}, town)
    reading = asyncio.create_task(agent("bead", "list", "--json"))
    beats = Bucket(nc, town.heartbeat_bucket)
    seen: list[heartbeats.AgentHeartbeat] = []

    async def renewed_twice() -> None:
        while len(seen) < 2:
            entry = await beats.get(SESSION_ENV["GT_SESSION"])
            beat = heartbeats.decode_agent(entry.value if entry else None)
            if beat is not None and (not seen or beat.ts > seen[-1].ts):
                seen.append(beat)
            await asyncio.sleep(0.2)

    await asyncio.wait_for(renewed_twice(), 30)
    assert not reading.done(), "still waiting for the mayor"
    assert "a gt call waiting for" in seen[-1].note, seen
    async with run_mayor(town, rigs=()):
        read = await asyncio.wait_for(reading, 60)
    assert read.code == 0, read
