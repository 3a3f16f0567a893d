"""What every benchmark shares: a fresh nats-server configured as shipped, fast history loading, figures.

Each benchmark measures its ceiling on the same server in the same run and reports figure, ceiling and
ratio; nothing here asserts a time.
"""

from __future__ import annotations

import asyncio
import math
import os
import platform
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import nats
import psutil
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy, StreamConfig

from gt.embedded_nats import EmbeddedServer, find_server_binary
from shared.bus.append import BATCH_COMMIT, BATCH_ID, BATCH_SEQ
from shared.bus.commands import encode, subject_of
from shared.bus.query import ask
from shared.bus.topology import provision
from shared.core import subjects
from shared.core.config import TownConfig
from shared.core.errors import QueryError
from shared.model.commands import Command
from shared.model.events import BeadClosed, BeadCreated, BeadUpdated, Event, decode_envelope, encode_event
from shared.model.queries import Status

REPO_ROOT = Path(__file__).resolve().parent.parent
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class Figure:
    """One measured quantity next to its ceiling from the same run."""

    name: str
    value: float
    unit: str
    ceiling: float | None = None
    ceiling_name: str = ""
    target: str = ""
    higher_is_better: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        if self.ceiling is None or self.ceiling == 0:
            return None
        if self.value == 0:
            # Nothing measurable (no CPU time in the window): as good as it gets against a cost, none of a rate.
            return 0.0 if self.higher_is_better else math.inf
        return self.value / self.ceiling if self.higher_is_better else self.ceiling / self.value

    def line(self) -> str:
        ratio = f"  ratio {self.ratio:.3f}" if self.ratio is not None else ""
        ceiling = (
            f"  (ceiling: {self.ceiling_name} {self.ceiling:,.1f} {self.unit})" if self.ceiling is not None else ""
        )
        target = f"  target {self.target}" if self.target else ""
        return f"{self.name}: {self.value:,.2f} {self.unit}{ceiling}{ratio}{target}"


@contextmanager
def server() -> Iterator[EmbeddedServer]:
    """A fresh nats-server with the shipped settings (JetStream, ``sync_interval: always``)."""
    with tempfile.TemporaryDirectory(prefix="gt-bench-") as root:
        srv = EmbeddedServer(Path(root))
        srv.start()
        try:
            yield srv
        finally:
            srv.stop()


async def connect(url: str) -> Client:
    return await nats.connect(url, max_reconnect_attempts=-1, pending_size=256 * 1024 * 1024)


async def provisioned(url: str) -> tuple[Client, TownConfig]:
    nc = await connect(url)
    town = TownConfig(nats_url=url)
    await provision(nc, town)
    return nc, town


def bead_history(
    beads: int, updates_per_bead: int, *, close: bool = True, description_bytes: int = 0, first: int = 0
) -> Iterator[tuple[str, bytes]]:
    """(subject, data) of a realistic bead history: create, updates, close for each bead, interleaved in
    rounds so aggregates mix in the stream as they would in a busy town. Each bead's description is
    ``description_bytes`` long; the beads are ``hq-<first>`` on (six digits)."""

    def event(payload: Event, n: int) -> bytes:
        return encode_event(payload, event_id=f"{n:020x}", ts=T0, actor="operator:bench", causation_id=f"c{n}")

    n = 0
    for rnd in range(updates_per_bead + (2 if close else 1)):
        for b in range(first, first + beads):
            bead_id = f"hq-{b:06d}"
            payload: Event
            if rnd == 0:
                payload = BeadCreated(
                    bead_id=bead_id,
                    title=f"Bench bead {b}",
                    labels=["bench"],
                    priority=b % 5,
                    description="d" * description_bytes,
                )
            elif rnd == updates_per_bead + 1:
                payload = BeadClosed(bead_id=bead_id, reason="done")
            else:
                payload = BeadUpdated(bead_id=bead_id, metadata={f"k{rnd}": str(b)}, add_labels=[f"r{rnd % 4}"])
            n += 1
            yield subjects.event_subject("bead", bead_id), event(payload, n)


async def bulk_load(nc: Client, messages: Iterator[tuple[str, bytes]], *, batch: int = 1000) -> int:
    """Store messages fast: atomic batches of ``batch`` (one fsync each). Returns how many were stored."""
    stored = 0
    chunk: list[tuple[str, bytes]] = []

    async def flush() -> None:
        nonlocal stored
        batch_id = secrets.token_hex(8)
        last = len(chunk) - 1
        for i, (subject, data) in enumerate(chunk):
            headers = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(i + 1)}
            if i < last:
                await nc.publish(subject, data, headers=headers)
            else:
                headers["Nats-Batch-Commit"] = "1"
                reply = await nc.request(subject, data, headers=headers, timeout=30)
                if b'"error"' in reply.data:
                    raise RuntimeError(f"bulk load refused: {reply.data!r}")
        stored += len(chunk)
        chunk.clear()

    for message in messages:
        chunk.append(message)
        if len(chunk) >= batch:
            await flush()
    if chunk:
        await flush()
    return stored


LOG_DIR = REPO_ROOT / "artifacts" / "bench-logs"


def start_service(
    name: str, url: str, *extra: str, log_path: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Run a service as the product runs it: its own process (logs in ``artifacts/bench-logs``), with
    ``env`` added to this process's environment."""
    if log_path is None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        log_path = LOG_DIR / f"{name}-{datetime.now(UTC):%Y%m%dT%H%M%S}.log"
    env = {**os.environ, "NATS_URL": url, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    out = log_path.open("ab") if log_path else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            [sys.executable, "-m", f"services.{name}", "--log-json", *extra],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    finally:
        if log_path and not isinstance(out, int):
            out.close()


def stop_service(proc: subprocess.Popen[bytes], *, grace: float = 30.0) -> None:
    """SIGTERM, and SIGKILL after ``grace``; a service that needs the kill is a finding, so it raises."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR2)  # have it log what it is stuck on before it goes
        time.sleep(1)
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{proc.args!r} did not stop within {grace}s of SIGTERM") from None


async def wait_ready(nc: Client, service: str, *, timeout: float = 600) -> float:
    """Wait until ``service`` reports it has caught up; returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            status = await ask(nc, Status(service=service), timeout=1)
        except (QueryError, nats.errors.Error):
            await asyncio.sleep(0.02)
            continue
        if status.caught_up:
            return time.monotonic() - started
        await asyncio.sleep(0.02)
    raise TimeoutError(f"{service} did not catch up within {timeout}s")


async def publish_all(nc: Client, subject: str, bodies: list[bytes]) -> float:
    """Seconds to store ``bodies`` with ``publish_async``, all in flight at once."""
    js = nc.jetstream()
    started = time.perf_counter()
    futures = [await js.publish_async(subject, body) for body in bodies]
    await asyncio.gather(*futures)
    return time.perf_counter() - started


async def raw_publish_ceiling(nc: Client, bodies: list[bytes]) -> float:
    """The ceiling of a command path: raw ``publish_async`` of as many messages of the same size."""
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="BENCH_RAW", subjects=["bench.raw.>"]))
    try:
        return await publish_all(nc, "bench.raw.x", bodies)
    finally:
        await js.delete_stream("BENCH_RAW")


STORE_SAMPLES = 30


async def store_costs(nc: Client) -> tuple[float, float]:
    """Median milliseconds, on this server, to store one message (acknowledged) and to store an atomic batch of
    two (what settling a command that makes one event stores: the event and the outcome). On a stream of one
    replica nats-server stages each atomic batch in a file store of its own before committing it: that costs far
    more than the fsync of the write itself, and it is what a command's answer waits on, whoever sends it."""
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="BENCH_STORE", subjects=["bench.store.>"], allow_atomic=True))
    body = b'{"title": "a bench bead"}'
    single: list[float] = []
    batch: list[float] = []
    try:
        for i in range(STORE_SAMPLES):
            started = time.perf_counter()
            await js.publish("bench.store.one", body)
            single.append((time.perf_counter() - started) * 1000)
            batch_id = uuid.uuid4().hex[:16]
            started = time.perf_counter()
            await nc.publish("bench.store.a", body, headers={BATCH_ID: batch_id, BATCH_SEQ: "1"})
            reply = await nc.request(
                "bench.store.b", body, timeout=5, headers={BATCH_ID: batch_id, BATCH_SEQ: "2", BATCH_COMMIT: "1"}
            )
            batch.append((time.perf_counter() - started) * 1000)
            if b'"error"' in reply.data:
                raise RuntimeError(f"atomic batch {i} refused: {reply.data!r}")
    finally:
        await js.delete_stream("BENCH_STORE")
    return statistics.median(single), statistics.median(batch)


def bodies_of(cmds: Sequence[Command]) -> list[bytes]:
    """The commands' bodies, as ``shared.bus.commands`` encodes them (the ceilings publish as many of that size)."""
    return [encode(cmd) for cmd in cmds]


async def run_commands(nc: Client, cmds: Sequence[Command]) -> tuple[float, float, list[dict[str, Any]]]:
    """Store commands of one type on their subject (all in flight: ``publish_async``, the path whose ceiling is
    measured beside it, where a client's ``shared.bus.commands.send`` stores one at a time) and wait for their
    outcomes in the log. The commands carry no id: the services give each ``cmd-<GT_CMD sequence>``.

    Returns (seconds from the first publish to the last outcome, seconds to store the commands, the
    outcomes' payloads)."""
    subject = subject_of(cmds[0])
    if any(type(cmd) is not type(cmds[0]) for cmd in cmds):
        raise ValueError("run_commands stores commands of one type")
    bodies = bodies_of(cmds)
    want = len(bodies)
    raw: list[bytes] = []
    done = asyncio.Event()

    async def on_outcome(msg: Any) -> None:
        raw.append(msg.data)
        if len(raw) >= want:
            done.set()

    sub = await nc.jetstream().subscribe(
        subjects.outcome_subject(">"),
        cb=on_outcome,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW),
    )
    started = time.perf_counter()
    stored_s = await publish_all(nc, subject, bodies)
    async with asyncio.timeout(600):
        await done.wait()
    elapsed = time.perf_counter() - started
    await sub.unsubscribe()
    outcomes = [{"type": env.type, **msgspec.json.decode(env.data)} for env in map(decode_envelope, raw)]
    return elapsed, stored_s, outcomes


Round = tuple[float, float]
"""(measured seconds, ceiling seconds) of one round: both timed in that round, one right after the other."""


def median_round(rounds: Sequence[Round]) -> Round:
    """The round whose ratio (ceiling / measured: the share of the ceiling reached) is the median; of an even
    count, the lower of the two middle ones. A figure a sceptic accepts: value and ceiling from one round, and
    never the best round (a lucky ceiling or a lucky measurement does not pick it)."""
    ordered = sorted(rounds, key=lambda r: r[1] / r[0])
    return ordered[(len(ordered) - 1) // 2]


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def machine() -> dict[str, str]:
    """What the figures were measured on."""
    version = subprocess.run([find_server_binary(), "--version"], capture_output=True, text=True, check=False).stdout
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": str(os.cpu_count()),
        "memory": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "platform": platform.platform(),
        "python": platform.python_version(),
        "nats-server": version.strip(),
    }
