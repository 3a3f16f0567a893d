"""Reading the real log: replay, catch-up, then live on one subscription, through restarts and gaps."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from shared.bus.reader import EventReader
from shared.bus.topology import provision
from shared.core.config import TownConfig
from tests.helpers import assert_eventually


async def publish_events(nc: Client, count: int, *, start: int = 0) -> None:
    js = nc.jetstream()
    futures = [
        await js.publish_async(f"gt.evt.bead.hq-{i % 50}", f"event {i}".encode()) for i in range(start, start + count)
    ]
    await asyncio.gather(*futures)


class Recorder:
    """What an apply function saw, in order; optionally slow for its first ``slow_for`` calls, to provoke
    client-side drops."""

    def __init__(self, delay: float = 0.0, slow_for: int = 0) -> None:
        self.seqs: list[int] = []
        self.delay = delay
        self.slow_for = slow_for

    def __call__(self, seq: int, subject: str, data: bytes) -> None:
        if self.delay and len(self.seqs) < self.slow_for:
            time.sleep(self.delay)  # a slow projection: blocks the loop on purpose
        self.seqs.append(seq)


@contextlib.asynccontextmanager
async def running(reader: EventReader) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(reader.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
async def log(nc: Client, town: TownConfig) -> Client:
    await provision(nc, town)
    return nc


async def test_replays_then_reports_caught_up_then_follows_live_without_gap_or_duplicate(
    log: Client, town: TownConfig
) -> None:
    await publish_events(log, 2000)
    seen = Recorder()
    reader = EventReader(log, town.evt_stream, seen)
    async with running(reader):
        await asyncio.wait_for(reader.caught_up.wait(), 30)
        assert reader.target_seq == 2000
        assert seen.seqs[-1] >= 2000
        # Live events arrive on the same subscription, interleaving with nothing missed.
        await publish_events(log, 500, start=2000)
        await assert_eventually(lambda: len(seen.seqs) == 2500)
    assert seen.seqs == list(range(1, 2501))
    assert reader.resyncs == 0


async def test_an_empty_stream_is_caught_up_at_once(log: Client, town: TownConfig) -> None:
    seen = Recorder()
    reader = EventReader(log, town.evt_stream, seen)
    async with running(reader):
        await asyncio.wait_for(reader.caught_up.wait(), 10)
        await publish_events(log, 3)
        await assert_eventually(lambda: seen.seqs == [1, 2, 3])


async def test_replay_starts_after_the_given_sequence(log: Client, town: TownConfig) -> None:
    await publish_events(log, 100)
    seen = Recorder()
    reader = EventReader(log, town.evt_stream, seen, start_after=60)
    async with running(reader):
        await asyncio.wait_for(reader.caught_up.wait(), 10)
    assert seen.seqs == list(range(61, 101))


async def test_wait_for_seq_returns_once_applied(log: Client, town: TownConfig) -> None:
    seen = Recorder()
    reader = EventReader(log, town.evt_stream, seen)
    async with running(reader):
        await asyncio.wait_for(reader.caught_up.wait(), 10)
        waiter = asyncio.create_task(reader.wait_for_seq(20))
        await publish_events(log, 10)
        await assert_eventually(lambda: reader.last_seq == 10)
        assert not waiter.done()
        await publish_events(log, 10, start=10)
        await asyncio.wait_for(waiter, 10)
        assert reader.last_seq >= 20
        with pytest.raises(TimeoutError):
            await reader.wait_for_seq(1000, timeout=0.2)


async def test_a_gap_from_client_side_drops_is_detected_and_resynced(log: Client, town: TownConfig) -> None:
    await publish_events(log, 3000)
    # A tiny pending limit plus a slow apply makes nats-py drop messages silently (its ordered consumer
    # advances its own sequence first); the reader must notice the jump and read the gap again.
    seen = Recorder(delay=0.002, slow_for=100)
    reader = EventReader(log, town.evt_stream, seen, pending_msgs_limit=200, watchdog_interval=0.5)
    async with running(reader):
        await asyncio.wait_for(reader.caught_up.wait(), 60)
    assert seen.seqs == list(range(1, 3001))
    assert reader.gaps >= 1
    assert reader.resyncs >= 1


async def test_following_survives_a_server_restart(own_nats_server: Any, tmp_path: Any) -> None:
    town = TownConfig(nats_url=own_nats_server.url, gt_home=tmp_path)
    client = await nats.connect(town.nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    try:
        await provision(client, town)
        await publish_events(client, 500)
        seen = Recorder()
        reader = EventReader(client, town.evt_stream, seen, idle_heartbeat=0.5, watchdog_interval=0.5)
        async with running(reader):
            await asyncio.wait_for(reader.caught_up.wait(), 10)
            await asyncio.to_thread(own_nats_server.restart)
            await assert_eventually(lambda: client.is_connected, timeout=30)
            await publish_events(client, 500, start=500)
            await assert_eventually(lambda: len(seen.seqs) >= 1000, timeout=60)
        assert seen.seqs == list(range(1, 1001))
    finally:
        await client.close()


async def test_a_consumer_deleted_on_the_server_is_replaced(log: Client, town: TownConfig) -> None:
    await publish_events(log, 100)
    seen = Recorder()
    reader = EventReader(log, town.evt_stream, seen, idle_heartbeat=0.5, watchdog_interval=0.5)
    js = log.jetstream()
    async with running(reader):
        await asyncio.wait_for(reader.caught_up.wait(), 10)
        for consumer in await js.consumers_info(town.evt_stream):
            await js.delete_consumer(town.evt_stream, consumer.name)
        await publish_events(log, 100, start=100)
        await assert_eventually(lambda: len(seen.seqs) >= 200, timeout=30)
    assert seen.seqs == list(range(1, 201))
