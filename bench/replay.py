"""(a) Rebuilding the mayor's projection from the log vs the raw ceiling; (b) start-up from a snapshot.

(a) ceiling: nats-py's ordered push consumer reading the whole stream with the two-step decode (envelope,
    then typed payload) and nothing else. Measured: the project's EventReader (gap checks included)
    feeding the mayor's projection (decode + fold). Target: ratio >= 0.7.
(b) a mayor started in a fresh process on a town with that history and a snapshot: time from ``run()``
    to caught up (bench/startup_probe.py; the time from process start is reported beside it).
    Ceiling: fetching the snapshot object and restoring it, nothing else. Target: under 1 s.
"""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import time

from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy

from bench.common import REPO_ROOT, Figure, Round, bead_history, bulk_load, median_round, provisioned, server
from services.mayor.projection import new_projection
from shared import runtime, subjects
from shared.bus.reader import EventReader
from shared.bus.snapshots import SnapshotStore
from shared.config import TownConfig
from shared.events import REGISTRY, decode_envelope
from shared.subjects import parse_js_reply


async def _ceiling_replay(nc: Client, town: TownConfig, last: int) -> float:
    """Seconds for the ordered consumer + two-step decode over the whole stream."""
    done = asyncio.Event()
    count = 0

    async def on_msg(msg: object) -> None:
        nonlocal count
        seq = parse_js_reply(msg.reply).stream_seq  # type: ignore[attr-defined]
        REGISTRY.decode_payload(decode_envelope(msg.data))  # type: ignore[attr-defined]
        count += 1
        if seq >= last:
            done.set()

    started = time.perf_counter()
    sub = await nc.jetstream().subscribe(
        subjects.EVT_ALL,
        stream=town.evt_stream,
        cb=on_msg,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    await done.wait()
    elapsed = time.perf_counter() - started
    await sub.unsubscribe()
    assert count == last
    return elapsed


async def _projection_replay(nc: Client, town: TownConfig, last: int) -> tuple[float, object]:
    """Seconds for EventReader + the mayor's projection over the whole stream."""
    projection = new_projection()
    reader = EventReader(nc, town.evt_stream, projection.apply)
    started = time.perf_counter()
    task = asyncio.create_task(reader.run())
    await reader.caught_up.wait()
    elapsed = time.perf_counter() - started
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert projection.last_seq == last
    return elapsed, projection


async def run(total_events: int = 1_000_000, rounds: int = 2) -> list[Figure]:
    runtime.tune_gc()  # as every service process runs (shared/entrypoint.py)
    beads = max(1, total_events // 10)
    figures: list[Figure] = []
    with server() as srv:
        nc, town = await provisioned(srv.url)
        load_started = time.perf_counter()
        last = await bulk_load(nc, bead_history(beads, updates_per_bead=8))
        load_s = time.perf_counter() - load_started
        print(f"loaded {last:,} events ({beads:,} beads) in {load_s:.1f}s", flush=True)

        replays: list[Round] = []
        projection = None
        for _ in range(rounds):
            gc.collect()
            ceiling_s = await _ceiling_replay(nc, town, last)
            gc.collect()
            elapsed, projection = await _projection_replay(nc, town, last)
            replays.append((elapsed, ceiling_s))
        replay_s, replay_ceiling_s = median_round(replays)
        figures.append(
            Figure(
                name=f"(a) rebuild the mayor's projection from {last:,} events",
                value=last / replay_s,
                unit="events/s",
                ceiling=last / replay_ceiling_s,
                ceiling_name="ordered consumer + decode",
                target=">= 0.7",
                notes=[f"{replay_s:.1f}s vs {replay_ceiling_s:.1f}s; the median round of {rounds}; {beads:,} beads"],
            )
        )
        print(figures[-1].line(), flush=True)

        # (b) store the projection as the mayor's snapshot, then start a mayor on it.
        assert projection is not None
        info = await nc.jetstream().stream_info(town.evt_stream)
        stream_id = info.created.isoformat() if info.created else town.evt_stream
        snapshot = projection.snapshot(stream_id)  # type: ignore[attr-defined]
        store = SnapshotStore(nc, town.snapshot_bucket)
        await store.save("mayor", snapshot)
        del projection
        gc.collect()

        def fresh_process(*args: str) -> dict[str, float]:
            probe = subprocess.run(
                [sys.executable, "-m", "bench.startup_probe", srv.url, *args],
                capture_output=True,
                text=True,
                check=True,
                cwd=REPO_ROOT,
            )
            result: dict[str, float] = json.loads(probe.stdout)
            return result

        startups: list[Round] = []
        probes: list[dict[str, float]] = []
        for _ in range(rounds):
            # Fresh processes, as a restarted service would be, timed from their own start (interpreter and
            # imports included): the ceiling fetches and restores the snapshot alone, the probe runs the mayor.
            floor = await asyncio.to_thread(fresh_process, "ceiling")
            result = await asyncio.to_thread(fresh_process)
            assert (result["last_seq"], result["applied"]) == (last, 0), result
            startups.append((result["process_to_ready_s"], floor["process_to_restored_s"]))
            probes.append(result)
        chosen = median_round(startups)
        startup_s, startup_ceiling_s = chosen
        probe = probes[startups.index(chosen)]
        figures.append(
            Figure(
                name=f"(b) mayor start-up with {last:,} events of history, from a snapshot, from process start",
                value=startup_s,
                unit="s",
                ceiling=startup_ceiling_s,
                ceiling_name="a process that fetches and restores the snapshot alone",
                target="< 1 s",
                higher_is_better=False,
                notes=[
                    f"snapshot {len(snapshot) / 2**20:.1f} MiB",
                    f"{probe['run_to_ready_s']:.2f}s of it from the service's run() (imports done)",
                    f"a full replay takes {replay_s:.1f}s; the median round of {rounds}",
                ],
            )
        )
        print(figures[-1].line(), flush=True)
        await nc.close()
    return figures


if __name__ == "__main__":
    for figure in asyncio.run(run()):
        print(figure.line())
