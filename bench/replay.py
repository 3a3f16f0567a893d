"""(a) Rebuilding the mayor's projection from the log vs the raw ceiling; (b) start-up from a snapshot.

(a) ceiling: nats-py's ordered push consumer reading the whole stream with the two-step decode (envelope,
    then typed payload) and nothing else. Measured: the project's EventReader (gap checks included)
    feeding the mayor's projection (decode + fold). Target: ratio >= 0.7.
(b) each service (``python -m services.<name>``, as the product starts it) on a town with that history and its
    snapshot: from just before its process is started until its ``service_ready`` log record (caught up, acting,
    taking commands). Ceiling: a fresh process fetching the snapshot and restoring it, nothing else
    (bench/startup_probe.py), timed the same way. Target: under 1 s.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy

from bench.common import (
    REPO_ROOT,
    Figure,
    Round,
    bead_history,
    bulk_load,
    median_round,
    provisioned,
    server,
    start_service,
    stop_service,
)
from services.mayor.projection import new_projection
from shared.bus.reader import EventReader
from shared.bus.snapshots import SnapshotStore
from shared.core import subjects
from shared.core.config import TownConfig
from shared.core.subjects import parse_js_reply
from shared.model.events import REGISTRY, decode_envelope
from shared.service import heap as runtime
from shared.service.projection import Projection


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


async def _projection_replay(nc: Client, town: TownConfig, last: int) -> tuple[float, Projection[Any]]:
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


SERVICES = ("mayor", "witness", "refinery", "deacon")


def _service_ready(log_path: Path, proc: subprocess.Popen[bytes], deadline: float) -> dict[str, Any]:
    """The service's ``service_ready`` log record, once it is written (its own timestamp says when)."""
    while time.monotonic() < deadline:
        for line in log_path.read_text(errors="replace").splitlines():
            if '"service_ready"' in line:
                record: dict[str, Any] = json.loads(line)
                return record
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited ({proc.returncode}) before it was ready; see {log_path}")
        time.sleep(0.05)
    raise TimeoutError(f"the service was not ready in time; see {log_path}")


def _time_startup(url: str, name: str, gt_home: Path, log_path: Path) -> dict[str, Any]:
    """Start service ``name`` as the product does and time it from just before its process was started until its
    ``service_ready`` record; then stop it."""
    spawned = time.time()
    proc = start_service(name, url, "--gt-home", str(gt_home), log_path=log_path)
    try:
        record = _service_ready(log_path, proc, time.monotonic() + 300)
    finally:
        stop_service(proc)
    ready_at = datetime.fromisoformat(record["timestamp"]).timestamp()
    return {**record, "from_start_s": ready_at - spawned}


def _time_ceiling(url: str, name: str) -> float:
    """A fresh process fetching and restoring the service's snapshot alone, timed from just before it started."""
    spawned = time.time()
    probe = subprocess.run(
        [sys.executable, "-m", "bench.startup_probe", url, name],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
    )
    restored_at: float = json.loads(probe.stdout)["restored_at"]
    return restored_at - spawned


async def _startups(
    url: str, nc: Client, town: TownConfig, last: int, mayor: Projection[Any], replay_s: float, rounds: int
) -> list[Figure]:
    figures: list[Figure] = []
    info = await nc.jetstream().stream_info(town.evt_stream)
    stream_id = info.created.isoformat() if info.created else town.evt_stream
    store = SnapshotStore(nc, town.snapshot_bucket)
    with tempfile.TemporaryDirectory(prefix="gt-bench-b-") as home:
        for name in SERVICES:
            projection: Projection[Any]
            if name == "mayor":
                projection = mayor  # built by (a)
            else:
                projection = importlib.import_module(f"services.{name}.projection").new_projection()
                reader = EventReader(nc, town.evt_stream, projection.apply)
                task = asyncio.create_task(reader.run())
                await reader.caught_up.wait()
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            snapshot = projection.snapshot(stream_id)
            await store.save(name, snapshot)
            del projection
            gc.collect()
            startups: list[Round] = []
            records: list[dict[str, Any]] = []
            for round_no in range(rounds):
                # Fresh processes, as a restarted service would be, timed from their start (interpreter and
                # imports included): the ceiling fetches and restores the snapshot alone.
                floor = await asyncio.to_thread(_time_ceiling, url, name)
                log_path = Path(home) / f"{name}-{round_no}.log"
                record = await asyncio.to_thread(_time_startup, url, name, Path(home), log_path)
                assert (record["last_seq"], record["applied"]) == (last, 0), record
                startups.append((record["from_start_s"], floor))
                records.append(record)
            chosen = median_round(startups)
            record = records[startups.index(chosen)]
            notes = [
                f"snapshot {len(snapshot) / 2**20:.1f} MiB",
                f"{record['seconds']:.2f}s of it from the service's run() (imports done)",
                *([f"a full replay takes {replay_s:.1f}s"] if name == "mayor" else []),
                f"the median round of {rounds}",
            ]
            figures.append(
                Figure(
                    name=f"(b) {name} start-up with {last:,} events of history, from a snapshot, from process start",
                    value=chosen[0],
                    unit="s",
                    ceiling=chosen[1],
                    ceiling_name="a process that fetches and restores the snapshot alone",
                    target="< 1 s",
                    higher_is_better=False,
                    notes=notes,
                )
            )
            print(figures[-1].line(), flush=True)
    return figures


async def run(total_events: int = 1_000_000, rounds: int = 2) -> list[Figure]:
    runtime.tune_gc()  # as every service process runs (shared/service/entrypoint.py)
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

        # (b) each service's projection of that history stored as its snapshot, then the service started on it.
        assert projection is not None
        # A round takes a second or two: more of them make the median a median (the machine's memory is noisy).
        figures += await _startups(srv.url, nc, town, last, projection, replay_s, 2 * rounds + 1)
        await nc.close()
    return figures


if __name__ == "__main__":
    for figure in asyncio.run(run()):
        print(figure.line())
