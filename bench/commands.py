"""(c) ``bead.create`` end to end (stored command -> accepted outcome) with 10,000 in flight.

Ceiling: raw JetStream ``publish_async`` of the same number of messages of the same size, 10,000 in
flight, on the same server (sync_interval: always). Measured: the mayor as its own process; the bench
stores 10,000 commands with ``publish_async`` and counts outcomes on an ordered consumer; the rate is
commands / (first publish -> last outcome). Target: ratio >= 0.3.
"""

from __future__ import annotations

import asyncio

from bench import common as common
from shared.model.commands import BeadCreate


async def run(commands: int = 10_000, rounds: int = 2) -> list[common.Figure]:
    creates = [BeadCreate(title=f"bench bead {i}", labels=["bench"], priority=i % 5) for i in range(commands)]
    bodies = common.bodies_of(creates)
    with common.server() as srv:
        nc, _town = await common.provisioned(srv.url)
        mayor = common.start_service("mayor", srv.url)
        try:
            await common.wait_ready(nc, "mayor")
            rounds_run: list[common.Round] = []
            stored = []
            for _ in range(rounds):
                ceiling_s = await common.raw_publish_ceiling(nc, bodies)
                elapsed, stored_s, _ = await common.run_commands(nc, creates)
                rounds_run.append((elapsed, ceiling_s))
                stored.append(stored_s)
        finally:
            common.stop_service(mayor)
        await nc.close()
    measured, ceiling = common.median_round(rounds_run)
    figure = common.Figure(
        name=f"(c) bead.create end to end, {commands:,} in flight",
        value=commands / measured,
        unit="commands/s",
        ceiling=commands / ceiling,
        ceiling_name="raw publish_async",
        target=">= 0.3",
        notes=[
            f"{measured:.2f}s to the last outcome (storing the commands alone took {min(stored):.2f}s); "
            f"the median round of {rounds}"
        ],
    )
    print(figure.line(), flush=True)
    return [figure]


if __name__ == "__main__":
    asyncio.run(run())
