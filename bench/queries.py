"""(d) Query latency: ``gt.q.mayor.get`` for a random bead on a 100,000-bead projection, p50 and p99.

Ceiling: a core NATS request/reply round trip to a trivial responder in its own Python process (nats-py,
a reply of the same size), on the same server. The ratio is ceiling p50 / query p50.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time

from bench.common import (
    REPO_ROOT,
    Figure,
    bead_history,
    bulk_load,
    percentile,
    provisioned,
    server,
    start_service,
    stop_service,
    wait_ready,
)
from shared.bus.connection import Connection
from shared.queries import mayor as mayor_queries

RESPONDER = """
import asyncio, sys, nats
async def main():
    nc = await nats.connect(sys.argv[1])
    reply = b"x" * int(sys.argv[2])
    async def echo(msg):
        await msg.respond(reply)
    await nc.subscribe("bench.echo", cb=echo)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


Request = tuple[str, bytes]
"""(subject, body) of one request, built before the clock starts."""


def requests(queries: list[mayor_queries.Get]) -> list[Request]:
    """The queries as ``shared.bus.query.ask`` sends them (it also decodes the reply, which the ceiling does not)."""
    return [(query.subject(), query.body()) for query in queries]


async def _latencies(nc: Connection, asked: list[Request]) -> list[float]:
    out = []
    for subject, body in asked:
        started = time.perf_counter()
        reply = await nc.request(subject, body, timeout=10)
        out.append((time.perf_counter() - started) * 1000)
        assert reply.data
    return out


async def run(beads: int = 100_000, queries: int = 5_000) -> list[Figure]:
    rng = random.Random(7)
    with server() as srv:
        nc, _ = await provisioned(srv.url)
        await bulk_load(nc, bead_history(beads, updates_per_bead=0, close=False))
        mayor = start_service("mayor", srv.url, "--no-snapshots")
        try:
            replay_s = await wait_ready(nc, "mayor")
            ids = [f"hq-{rng.randrange(beads):06d}" for _ in range(queries)]
            gets = requests([mayor_queries.Get(id=bead_id) for bead_id in ids])
            sample = json.loads((await nc.request(*gets[0], timeout=10)).data)
            assert sample["ok"], sample
            reply_size = len(json.dumps(sample))
            echoes = [("bench.echo", body) for _subject, body in gets]
            responder = subprocess.Popen(
                [sys.executable, "-c", RESPONDER, srv.url, str(reply_size)], stdout=subprocess.PIPE, cwd=REPO_ROOT
            )
            try:
                assert responder.stdout is not None
                responder.stdout.readline()
                await _latencies(nc, echoes[:200])  # warm both paths
                await _latencies(nc, gets[:200])
                ceiling = await _latencies(nc, echoes)
                measured = await _latencies(nc, gets)
                with_min_seq = await _latencies(nc, requests([mayor_queries.Get(id=i, min_seq=1) for i in ids[:1000]]))
            finally:
                responder.terminate()
                responder.wait(10)
        finally:
            stop_service(mayor)
        await nc.close()
    figures = [
        Figure(
            name=f"(d) bead get on a {beads:,}-bead projection, p50",
            value=percentile(measured, 50),
            unit="ms",
            ceiling=percentile(ceiling, 50),
            ceiling_name="core request/reply to a trivial responder",
            higher_is_better=False,
            notes=[f"{queries:,} sequential queries; the mayor replayed {beads:,} beads in {replay_s:.1f}s"],
        ),
        Figure(
            name=f"(d) bead get on a {beads:,}-bead projection, p99",
            value=percentile(measured, 99),
            unit="ms",
            ceiling=percentile(ceiling, 99),
            ceiling_name="core request/reply to a trivial responder",
            higher_is_better=False,
            notes=[f"with min_seq (read-your-writes): p50 {percentile(with_min_seq, 50):.2f} ms"],
        ),
    ]
    for figure in figures:
        print(figure.line(), flush=True)
    return figures


if __name__ == "__main__":
    asyncio.run(run())
