"""(c) ``bead.create`` end to end (stored command -> accepted outcome) with 10,000 in flight.

Ceiling: raw JetStream ``publish_async`` of the same number of messages of the same size, 10,000 in
flight, on the same server (sync_interval: always). Measured: the mayor as its own process; the bench
stores 10,000 commands with ``publish_async`` and counts outcomes on an ordered consumer; the rate is
commands / (first publish -> last outcome). Target: ratio >= 0.3.
"""

from __future__ import annotations

import asyncio
import json
import time

from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy, StreamConfig

from bench.common import Figure, provisioned, server, start_service, stop_service, wait_ready


async def _publish_all(nc: Client, subject: str, bodies: list[bytes]) -> float:
    js = nc.jetstream()
    started = time.perf_counter()
    futures = [await js.publish_async(subject, body) for body in bodies]
    await asyncio.gather(*futures)
    return time.perf_counter() - started


async def _ceiling(nc: Client, bodies: list[bytes]) -> float:
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="BENCH_RAW", subjects=["bench.raw.>"]))
    try:
        return await _publish_all(nc, "bench.raw.x", bodies)
    finally:
        await js.delete_stream("BENCH_RAW")


async def _commands(nc: Client, bodies: list[bytes]) -> tuple[float, float]:
    """(seconds to the last outcome, seconds to store the commands)."""
    want = len(bodies)
    got = 0
    done = asyncio.Event()

    async def on_outcome(msg: object) -> None:
        nonlocal got
        got += 1
        if got >= want:
            done.set()

    js = nc.jetstream()
    sub = await js.subscribe(
        "gt.evt.cmd.>", cb=on_outcome, ordered_consumer=True, config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW)
    )
    started = time.perf_counter()
    stored_s = await _publish_all(nc, "gt.cmd.bead.create", bodies)
    await asyncio.wait_for(done.wait(), 600)
    elapsed = time.perf_counter() - started
    await sub.unsubscribe()
    return elapsed, stored_s


async def run(commands: int = 10_000, rounds: int = 2) -> list[Figure]:
    bodies = [
        json.dumps({"title": f"bench bead {i}", "labels": ["bench"], "priority": i % 5}).encode()
        for i in range(commands)
    ]
    with server() as srv:
        nc, _town = await provisioned(srv.url)
        mayor = start_service("mayor", srv.url)
        try:
            await wait_ready(nc, "mayor")
            ceilings, measured, stored = [], [], []
            for _ in range(rounds):
                ceilings.append(await _ceiling(nc, bodies))
                elapsed, stored_s = await _commands(nc, bodies)
                measured.append(elapsed)
                stored.append(stored_s)
        finally:
            stop_service(mayor)
        await nc.close()
    best, ceiling = min(measured), min(ceilings)
    figure = Figure(
        name=f"(c) bead.create end to end, {commands:,} in flight",
        value=commands / best,
        unit="commands/s",
        ceiling=commands / ceiling,
        ceiling_name="raw publish_async",
        target=">= 0.3",
        notes=[
            f"{best:.2f}s to the last outcome (storing the commands alone took {min(stored):.2f}s); best of {rounds}"
        ],
    )
    print(figure.line(), flush=True)
    return [figure]


if __name__ == "__main__":
    asyncio.run(run())
