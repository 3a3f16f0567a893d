"""Start a mayor in a fresh process and report how long it took to become ready (used by bench/replay.py).

    python -m bench.startup_probe <nats-url>            # the service
    python -m bench.startup_probe <nats-url> ceiling    # fetching and restoring the snapshot alone

Prints one JSON object: ``run_to_ready_s`` (from ``service.run()`` until caught up, imports done) and
``process_to_ready_s`` (from the process's own start, interpreter and imports included); in ceiling mode
``ceiling_s`` (fetch and restore) and ``process_to_restored_s`` (from the process's own start).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time

import nats
import psutil
import structlog

from services.mayor.projection import new_projection
from services.mayor.service import MayorService
from shared import runtime
from shared.bus.snapshots import SnapshotStore
from shared.config import TownConfig
from shared.service import ServiceSettings


async def probe(url: str) -> dict[str, float]:
    service = MayorService(TownConfig(nats_url=url), ServiceSettings(patrol_interval=60))
    started = time.perf_counter()
    task = asyncio.create_task(service.run())
    await service.ready.wait()
    ready_at = time.time()
    result = {
        "run_to_ready_s": time.perf_counter() - started,
        "process_to_ready_s": ready_at - psutil.Process().create_time(),
        "applied": float(service.projection.applied),
        "last_seq": float(service.projection.last_seq),
    }
    await service.shutdown()
    await task
    return result


async def ceiling(url: str) -> dict[str, float]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    info = await js.stream_info("GT_EVT")
    stream_id = info.created.isoformat() if info.created else "GT_EVT"
    started = time.perf_counter()
    data = await SnapshotStore(nc, "GT_SNAP").load("mayor")
    assert data is not None
    restored = new_projection().restore(data, stream_id=stream_id, stream_last_seq=int(info.state.last_seq))
    elapsed = time.perf_counter() - started
    restored_at = time.time()
    assert restored
    await nc.close()
    return {"ceiling_s": elapsed, "process_to_restored_s": restored_at - psutil.Process().create_time()}


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    runtime.tune_gc()  # as the service entry point does
    measure = ceiling if sys.argv[2:] == ["ceiling"] else probe
    print(json.dumps(asyncio.run(measure(sys.argv[1]))))


if __name__ == "__main__":
    main()
