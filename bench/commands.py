"""(c) ``bead.create`` end to end (stored command -> accepted outcome) with 10,000 in flight.

Ceiling: raw JetStream ``publish_async`` of the same number of messages of the same size, 10,000 in
flight, on the same server (sync_interval: always). Measured: the mayor as its own process; the bench
stores 10,000 commands with ``publish_async`` and counts outcomes on an ordered consumer; the rate is
commands / (first publish -> last outcome). Target: ratio >= 0.3.
"""

from __future__ import annotations

import asyncio

from bench.common import (
    Figure,
    bodies_of,
    provisioned,
    raw_publish_ceiling,
    run_commands,
    server,
    start_service,
    stop_service,
    wait_ready,
)
from shared.commands import BeadCreate


async def run(commands: int = 10_000, rounds: int = 2) -> list[Figure]:
    creates = [BeadCreate(title=f"bench bead {i}", labels=["bench"], priority=i % 5) for i in range(commands)]
    bodies = bodies_of(creates)
    with server() as srv:
        nc, _town = await provisioned(srv.url)
        mayor = start_service("mayor", srv.url)
        try:
            await wait_ready(nc, "mayor")
            ceilings, measured, stored = [], [], []
            for _ in range(rounds):
                ceilings.append(await raw_publish_ceiling(nc, bodies))
                elapsed, stored_s, _ = await run_commands(nc, creates)
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
