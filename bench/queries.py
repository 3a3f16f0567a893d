"""(d) Query latency: ``gt.q.mayor.get`` for a random bead on a 100,000-bead projection, p50 and p99.
(r) A page of a list as the town grows: ``gt.q.mayor.ready`` and ``gt.q.mayor.list`` with ``limit`` 100, p50,
at 1,000, 10,000 and 100,000 beads; and every page of the whole list at 100,000 (``ask_all``, ``limit`` 0).

(d) ceiling: a core NATS request/reply round trip to a trivial responder in its own Python process (nats-py,
a reply of the same size), on the same server. The ratio is ceiling p50 / query p50.
(r) ceiling: the same page in the same run at 1,000 beads, so the ratio says how flat a page stays as the town
grows 100-fold (1.00: flat). The whole-list figure is a speed, its ceiling the page's rate at 1,000 beads.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

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
from shared.bus import streams
from shared.bus.connection import Connection
from shared.bus.query import ask_all, ask_json
from shared.core.config import TownConfig
from shared.model.queries import Query
from shared.model.queries import mayor as mayor_queries

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


def requests(queries: Sequence[Query[Any]]) -> list[Request]:
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


PAGE = 100
PAGE_ROUNDS = 200


async def _page_p50(nc: Connection, query: mayor_queries.Ready | mayor_queries.Beads) -> float:
    """p50 of ``PAGE_ROUNDS`` asks of one page, in ms, after a warm-up."""
    asked = requests([query])[0]
    await _latencies(nc, [asked] * 20)
    return percentile(await _latencies(nc, [asked] * PAGE_ROUNDS), 50)


async def _grown_to(nc: Connection, loaded: int, size: int) -> None:
    """Add beads up to ``size`` and wait until the mayor answers with all of them applied."""
    stored = await bulk_load(nc, bead_history(size - loaded, updates_per_bead=0, close=False, first=loaded))
    last = await streams.last_seq(nc, TownConfig(nats_url="").evt_stream)
    await ask_json(nc, mayor_queries.Ready(limit=1, min_seq=last), timeout=120)
    assert stored == size - loaded


async def _pages(nc: Connection, beads: int) -> list[Figure]:
    """(r): the page figures, growing the town from 1,000 beads to ``beads`` (tenfold steps)."""
    sizes = [size for size in (1_000, 10_000, 100_000) if size < beads] + [beads]
    loaded = 0
    at: dict[int, tuple[float, float]] = {}
    for size in sizes:
        await _grown_to(nc, loaded, size)
        loaded = size
        at[size] = (
            await _page_p50(nc, mayor_queries.Ready(limit=PAGE)),
            await _page_p50(nc, mayor_queries.Beads(limit=PAGE)),
        )
    started = time.perf_counter()
    listing = await ask_all(nc, mayor_queries.Ready(limit=0), timeout=120)
    whole_s = time.perf_counter() - started
    assert len(listing.items) == beads
    assert not listing.more
    small, large = sizes[0], sizes[-1]
    steps = ", ".join(f"{size:,}: {ready:.2f}/{listed:.2f} ms" for size, (ready, listed) in at.items())
    figures = [
        Figure(
            name=f"(r) `{query}` page of {PAGE} at {large:,} beads, p50",
            value=at[large][column],
            unit="ms",
            ceiling=at[small][column],
            ceiling_name=f"the same page at {small:,} beads",
            higher_is_better=False,
            notes=[f"ready/list p50 by size: {steps}"] if column == 0 else [],
        )
        for column, query in enumerate(("ready", "list"))
    ]
    figures += [
        Figure(
            name=f"(r) every ready bead of {large:,}, read page by page (limit 0)",
            value=beads / whole_s,
            unit="beads/s",
            ceiling=PAGE / (at[small][0] / 1000),
            ceiling_name=f"pages of {PAGE} at {small:,} beads",
            notes=[f"{whole_s:.2f}s in all; each page is what one 4 MB reply carries"],
        ),
    ]
    for figure in figures:
        print(figure.line(), flush=True)
    return figures


async def run(beads: int = 100_000, queries: int = 5_000) -> list[Figure]:
    rng = random.Random(7)
    with server() as srv:
        nc, _ = await provisioned(srv.url)
        mayor = start_service("mayor", srv.url, "--no-snapshots")
        try:
            await wait_ready(nc, "mayor")
            page_figures = await _pages(nc, beads)  # grows the town to ``beads``, which (d) then reads
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
            notes=[f"{queries:,} sequential queries"],
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
    return [*page_figures, *figures]


if __name__ == "__main__":
    asyncio.run(run())
