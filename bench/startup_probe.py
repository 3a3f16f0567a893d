"""The ceiling of bench (b): a fresh process that fetches one service's snapshot and restores it, nothing else.

    python -m bench.startup_probe <nats-url> <service>

Prints one JSON object: ``ceiling_s`` (fetch and restore, imports done) and ``restored_at`` (the wall clock then,
for the parent to time from the moment it started the process: interpreter and imports included). Not the
process's own start time as the kernel gives it: psutil adds it to the boot time, which Linux gives in whole
seconds, so it is off by up to a second.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import sys
import time

import nats
import structlog

from shared.bus.snapshots import SnapshotStore
from shared.core.config import TownConfig
from shared.service import heap as runtime


async def ceiling(url: str, service: str) -> dict[str, float]:
    town = TownConfig(nats_url=url)
    projection = importlib.import_module(f"services.{service}.projection").new_projection()
    nc = await nats.connect(url)
    info = await nc.jetstream().stream_info(town.evt_stream)
    stream_id = info.created.isoformat() if info.created else town.evt_stream
    started = time.perf_counter()
    data = await SnapshotStore(nc, town.snapshot_bucket).load(service)
    assert data is not None, f"no snapshot of {service}"
    # The projection is kept: freeing its state would be timed too, which a service never does.
    restored = projection.restore(data, stream_id=stream_id, stream_last_seq=int(info.state.last_seq))
    elapsed = time.perf_counter() - started
    restored_at = time.time()
    assert restored
    assert projection.last_seq == info.state.last_seq
    await nc.close()
    return {"ceiling_s": elapsed, "restored_at": restored_at}


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    runtime.tune_gc()  # as the service entry point does
    print(json.dumps(asyncio.run(ceiling(sys.argv[1], sys.argv[2]))))


if __name__ == "__main__":
    main()
