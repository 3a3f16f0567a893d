"""Plugins on a real nats-server: the SDK (typed, ordered, durable, at-least-once, retries, replay), the
idempotence helper under SIGKILL, the archiver and the metrics exporter as real processes, and a plain
nats-py subscriber that knows nothing but the subjects and `gt schema`.

Plugins that the acceptance points kill run as real subprocesses and get SIGKILL; the others run in the
test's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
import pytest
import structlog
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig

from services.mayor.projection import new_projection
from services.plugins.archive_files import ArchiveWriter, archive_files, read_archive
from services.plugins.archive_format import ArchiveCorruptError, ArchiveOrderError, encode_line, file_name
from services.plugins.metrics import MetricsOptions, MetricsPlugin
from shared.bus import log_read
from shared.bus.append import Appender, PendingEvent
from shared.bus.topology import create_kv, provision
from shared.core.config import TownConfig
from shared.core.errors import CommandError, NatsNotAnsweringError
from shared.core.subjects import event_subject
from shared.model.events import (
    BeadClaimed,
    BeadClosed,
    BeadCreated,
    BeadSlung,
    Envelope,
    Event,
    MergeRequestClaimed,
    MergeRequestSubmitted,
    SessionEnded,
    SessionRequested,
    SessionStarted,
    encode_event,
)
from shared.plugins import PLUGIN_BUCKET, Delivery, Plugin, PluginSettings, PluginStoppedError
from shared.plugins.process import plugin_parser, run_plugin
from shared.plugins.settings import position_key
from tests.conftest import REPO_ROOT
from tests.drivers import Driver, nats_driver
from tests.helpers import assert_eventually
from tests.log_tools import digest, fresh_replay, read_all

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
QUICK = {"poll_s": 0.02, "max_poll_s": 0.2, "backoff_s": 0.05, "max_backoff_s": 0.2}
"""Test timings: short polls for new events (catch-up checks stay quick) and short backoffs."""


def settings(name: str, **fields: Any) -> PluginSettings:
    return PluginSettings(name=name, **{**QUICK, **fields})


# ---- helpers ------------------------------------------------------------------------------------


@pytest.fixture
async def log(nc: Client, town: TownConfig) -> Appender:
    """The town's streams, and an appender to store events as the services do."""
    await provision(nc, town)
    return Appender(nc, town.evt_stream)


async def store(appender: Appender, *events: Event) -> list[int]:
    seqs = []
    for event in events:
        subject = event_subject(event.AGGREGATE, event.aggregate_id())
        event_id = f"ev-{os.urandom(5).hex()}"
        data = encode_event(event, event_id=event_id, ts=datetime.now(UTC), actor="test")
        seqs += await appender.append([PendingEvent(subject=subject, data=data, event_id=event_id)])
    return seqs


def beads(start: int, count: int) -> list[Event]:
    return [BeadCreated(bead_id=f"hq-{n:06d}", title=f"bead {n}") for n in range(start, start + count)]


async def stream_last(nc: Client) -> int:
    return int((await nc.jetstream().stream_info("GT_EVT")).state.last_seq)


@contextlib.asynccontextmanager
async def running(plugin: Plugin) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``plugin`` in this loop until the block ends; a plugin that fails early fails the test."""
    task = asyncio.create_task(plugin.run())
    ready = asyncio.ensure_future(plugin.ready.wait())
    await asyncio.wait({ready, task}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        ready.cancel()
        task.result()
    assert plugin.ready.is_set(), "the plugin did not start reading"
    try:
        yield task
    finally:
        await plugin.shutdown()
        await asyncio.wait_for(task, 30)


class Recorder(Plugin):
    """Records what the SDK hands over: (seq, delivered, type, payload class), and fails on demand."""

    def __init__(self, town: TownConfig, plugin_settings: PluginSettings, *, fail: dict[int, int] | None = None):
        super().__init__(town, plugin_settings)
        self.calls: list[tuple[int, int, str, str | None]] = []
        self._delivered = 0
        self.fail = dict(fail or {})
        """seq -> how many more calls of it fail (-1: all)."""

    async def handle_message(self, delivery: Delivery) -> None:
        self._delivered = delivery.delivered
        await super().handle_message(delivery)

    async def handle(self, seq: int, env: Envelope, payload: Event | None) -> None:
        self.calls.append((seq, self._delivered, env.type, type(payload).__name__ if payload else None))
        left = self.fail.get(seq, 0)
        if left:
            self.fail[seq] = left - 1 if left > 0 else left
            raise RuntimeError(f"handler failure injected at {seq}")

    def seqs(self) -> list[int]:
        return [seq for seq, *_ in self.calls]


async def recorded_position(nc: Client, name: str) -> int | None:
    """The position plugin ``name`` recorded in its marks (None: none)."""
    kv = await nc.jetstream().key_value(PLUGIN_BUCKET)
    try:
        entry = await kv.get(position_key(name))
    except nats.js.errors.KeyNotFoundError:
        return None
    return int(entry.value or b"")


async def all_recorded(nc: Client, name: str, seq: int) -> None:
    """Wait until plugin ``name`` has recorded that it is done with everything up to ``seq``."""

    async def check() -> bool:
        return await recorded_position(nc, name) == seq

    done: bool = await assert_eventually(check)
    assert done


# ---- the SDK ------------------------------------------------------------------------------------


class TestTypedOrderedDelivery:
    async def test_events_come_typed_in_order_and_unknown_ones_are_none_and_still_passed(
        self, nc: Client, town: TownConfig, log: Appender
    ) -> None:
        await store(log, *beads(1, 3))
        js = nc.jetstream()
        future = b'{"id":"ev-future","type":"beacon.lit","v":1,"ts":"2026-03-01T12:00:00Z","actor":"x","data":{}}'
        await js.publish("gt.evt.beacon.b1", future)  # a type a newer writer knows and this code does not
        await js.publish("gt.evt.junk.j1", b"not an envelope")
        await store(log, BeadClosed(bead_id="hq-000001"), BeadSlung(bead_id="hq-000002", rig="demo"))
        last = await stream_last(nc)
        plugin = Recorder(town, settings("typed"))
        with structlog.testing.capture_logs() as logs:
            async with running(plugin):
                await assert_eventually(lambda: plugin.last_seq == last)
        assert [(seq, type_, cls) for seq, _, type_, cls in plugin.calls] == [
            (1, "bead.created", "BeadCreated"),
            (2, "bead.created", "BeadCreated"),
            (3, "bead.created", "BeadCreated"),
            (4, "beacon.lit", None),
            (6, "bead.closed", "BeadClosed"),
            (7, "bead.slung", "BeadSlung"),
        ]
        assert (plugin.unknown, plugin.undecodable) == (1, 1)
        assert {entry["event"] for entry in logs} >= {"plugin_event_type_unknown", "plugin_event_undecodable"}
        await all_recorded(nc, "typed", last)

    async def test_a_filtered_plugin_sees_only_its_subjects(self, nc: Client, town: TownConfig, log: Appender) -> None:
        await store(log, *beads(1, 2))
        await store(log, SessionEnded(session_id="s-1", reason="done"), BeadClaimed(bead_id="hq-000001", assignee="a"))
        plugin = Recorder(town, settings("beads-only", subjects=("gt.evt.bead.>",)))
        async with running(plugin):
            await assert_eventually(lambda: plugin.last_seq == 4)
        assert plugin.seqs() == [1, 2, 4]

    async def test_several_filters_are_applied_by_the_plugin(self, nc: Client, town: TownConfig, log: Appender) -> None:
        await store(log, *beads(1, 2))
        claimed = MergeRequestClaimed(mr_id="mr-1", attempt=1, holder="refinery", lease_until=T0)
        await store(log, SessionEnded(session_id="s-1", reason="done"), claimed)
        await store(log, BeadClaimed(bead_id="hq-000001", assignee="a"))
        plugin = Recorder(town, settings("two-filters", subjects=("gt.evt.bead.>", "gt.evt.session.*"), batch=2))
        async with running(plugin):
            await assert_eventually(lambda: plugin.last_seq == 5)
        assert plugin.seqs() == [1, 2, 3, 5]
        await all_recorded(nc, "two-filters", 5)


class TestPosition:
    async def test_a_restarted_plugin_resumes_where_it_left_off(
        self, nc: Client, town: TownConfig, log: Appender
    ) -> None:
        await store(log, *beads(1, 5))
        first = Recorder(town, settings("resume"))
        async with running(first):
            await assert_eventually(lambda: first.last_seq == 5)
        await all_recorded(nc, "resume", 5)
        await store(log, *beads(6, 3))
        again = Recorder(town, settings("resume"))
        async with running(again):
            await assert_eventually(lambda: again.last_seq == 8)
        assert first.seqs() == [1, 2, 3, 4, 5]
        assert again.seqs() == [6, 7, 8]
        assert again.start_plan == (6, "position")

    async def test_a_plugin_stopped_mid_log_resumes_after_its_last_handled_event(
        self, nc: Client, town: TownConfig, log: Appender
    ) -> None:
        await store(log, *beads(1, 12))

        class StopsAtSix(Recorder):
            async def handle(self, seq: int, env: Envelope, payload: Event | None) -> None:
                await super().handle(seq, env, payload)
                if seq == 6:
                    await self.shutdown()  # in the middle of its batch (5..8): it finishes the event in hand

        first = StopsAtSix(town, settings("midway", batch=4))
        task = asyncio.create_task(first.run())
        await asyncio.wait_for(task, 30)
        assert first.seqs() == [1, 2, 3, 4, 5, 6]
        assert await recorded_position(nc, "midway") == 6
        again = Recorder(town, settings("midway", batch=4))
        async with running(again):
            await assert_eventually(lambda: again.last_seq == 12)
        assert again.start_plan == (7, "position")
        assert again.seqs() == list(range(7, 13))  # nothing twice, nothing skipped

    async def test_replay_from_start_delivers_everything_again_and_forgets_the_marks(
        self, nc: Client, town: TownConfig, log: Appender
    ) -> None:
        await store(log, *beads(1, 4))
        firsts: list[bool] = []

        class Marking(Plugin):
            async def handle(self, seq: int, env: Envelope, payload: Event | None) -> None:
                async with self.once(env.id) as claim:
                    firsts.append(claim.first)

        plugin = Marking(town, settings("replayer"))
        async with running(plugin):
            await assert_eventually(lambda: plugin.last_seq == 4)
        await all_recorded(nc, "replayer", 4)
        kv = await nc.jetstream().key_value(PLUGIN_BUCKET)
        # Its position lost, the plugin gets the same events once more: the marks say they are done.
        await kv.put(position_key("replayer"), b"0")
        again = Marking(town, settings("replayer"))
        async with running(again):
            await assert_eventually(lambda: again.last_seq == 4)
        await kv.put("replayer.ev-stale", b"done")  # one of its marks the replay forgets
        await kv.put("other.ev-kept", b"done")  # another plugin's: kept
        replay = Marking(town, settings("replayer", replay_from_start=True))
        async with running(replay):
            await assert_eventually(lambda: replay.last_seq == 4)
        assert firsts == [True] * 4 + [False] * 4 + [True] * 4
        assert replay.start_plan == (1, "replay_from_start")
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await kv.get("replayer.ev-stale")
        assert (await kv.get("other.ev-kept")).value == b"done"
        await all_recorded(nc, "replayer", 4)

    async def test_a_position_outlives_the_marks_ttl(self, nc: Client, town: TownConfig) -> None:
        js = nc.jetstream()
        kv = await create_kv(js, "GT_SHORT", ttl=1.0, replicas=1)  # as the marks bucket is made, with a 1 s TTL
        try:
            await log_read.put_kept(nc, "GT_SHORT", position_key("idle"), b"41")
            await kv.put("idle.ev-1", b"done")
            await asyncio.sleep(2.5)
            assert (await kv.get(position_key("idle"))).value == b"41"  # a plugin down for long resumes there
            with pytest.raises(nats.js.errors.KeyNotFoundError):
                await kv.get("idle.ev-1")
        finally:
            await js.delete_stream("KV_GT_SHORT")  # not one of the town's: the reset between tests leaves it

    async def test_batches_end_where_the_log_or_the_filter_does(
        self, nc: Client, town: TownConfig, log: Appender
    ) -> None:
        await store(log, *beads(1, 5))
        await store(log, SessionEnded(session_id="s-1", reason="done"))
        whole = await log_read.read_batch(nc, "GT_EVT", 2, 3, 1 << 20)
        assert [m.seq for m in whole.messages] == [2, 3, 4]
        assert whole.pending == 2
        assert whole.messages[0].subject == "gt.evt.bead.hq-000002"
        small = await log_read.read_batch(nc, "GT_EVT", 1, 10, 1)  # max_bytes: at least one all the same
        assert ([m.seq for m in small.messages], small.pending) == ([1], 5)
        filtered = await log_read.read_batch(nc, "GT_EVT", 1, 10, 1 << 20, subject="gt.evt.session.*")
        assert ([m.seq for m in filtered.messages], filtered.pending) == ([6], 0)
        assert await log_read.read_batch(nc, "GT_EVT", 7, 10, 1 << 20) == ([], 0)
        assert await log_read.read_batch(nc, "GT_EVT", 1, 10, 1 << 20, subject="gt.evt.mr.>") == ([], 0)
        with pytest.raises(NatsNotAnsweringError) as nothing:  # the bus's words for nats-py's NoRespondersError
            await log_read.read_batch(nc, "GT_NOSUCH", 1, 10, 1 << 20)
        assert nothing.value.what == "NoRespondersError"

    async def test_a_plugin_that_read_through_a_consumer_starts_after_its_acknowledged_floor(
        self, nc: Client, town: TownConfig, log: Appender
    ) -> None:
        await store(log, *beads(1, 6))
        js = nc.jetstream()
        # What an earlier version left: the durable consumer plugin-<name>, everything up to 4 acknowledged.
        await js.add_consumer("GT_EVT", ConsumerConfig(durable_name="plugin-upgraded", ack_policy=AckPolicy.EXPLICIT))
        sub = await js.pull_subscribe_bind("plugin-upgraded", "GT_EVT")
        for msg in await sub.fetch(4, timeout=5):
            await msg.ack_sync()
        await sub.unsubscribe()
        plugin = Recorder(town, settings("upgraded"))
        async with running(plugin):
            await assert_eventually(lambda: plugin.last_seq == 6)
        assert plugin.start_plan == (5, "consumer_floor")
        assert plugin.seqs() == [5, 6]
        await all_recorded(nc, "upgraded", 6)


class TestRedelivery:
    async def test_a_failed_event_comes_again_after_a_backoff_before_any_later_one(
        self, nc: Client, town: TownConfig, log: Appender
    ) -> None:
        await store(log, *beads(1, 6))
        plugin = Recorder(town, settings("flaky", batch=4), fail={3: 2})
        with structlog.testing.capture_logs() as logs:
            async with running(plugin):
                await assert_eventually(lambda: plugin.last_seq == 6)
        assert plugin.seqs() == [1, 2, 3, 3, 3, 4, 5, 6]
        assert [delivered for seq, delivered, *_ in plugin.calls if seq == 3] == [1, 2, 3]  # handed over again
        failures = [entry for entry in logs if entry["event"] == "plugin_handler_failed"]
        assert [(f["seq"], f["attempt"]) for f in failures] == [(3, 1), (3, 2)]
        assert failures[0]["retry_in_s"] < failures[1]["retry_in_s"]
        await all_recorded(nc, "flaky", 6)

    async def test_when_attempts_run_out_a_skipping_plugin_records_the_event_and_goes_on(
        self, nc: Client, town: TownConfig, log: Appender
    ) -> None:
        await store(log, *beads(1, 4))
        plugin = Recorder(town, settings("skipper", max_attempts=3, on_exhausted="skip"), fail={2: -1})
        with structlog.testing.capture_logs() as logs:
            async with running(plugin):
                await assert_eventually(lambda: plugin.last_seq == 4)
        assert plugin.seqs() == [1, 2, 2, 2, 3, 4]
        [abandoned] = [entry for entry in logs if entry["event"] == "plugin_event_abandoned"]
        assert (abandoned["seq"], abandoned["attempts"], abandoned["log_level"]) == (2, 3, "error")
        kv = await nc.jetstream().key_value(PLUGIN_BUCKET)
        record = json.loads((await kv.get("skipper.dead.2")).value or b"")
        assert (record["seq"], record["attempts"], record["subject"]) == (2, 3, "gt.evt.bead.hq-000002")
        assert "handler failure injected at 2" in record["error"]
        await all_recorded(nc, "skipper", 4)  # passed over: never handed over again

    async def test_when_attempts_run_out_a_stopping_plugin_fails_and_the_event_comes_first_next_time(
        self, nc: Client, town: TownConfig, log: Appender
    ) -> None:
        await store(log, *beads(1, 4))
        broken = Recorder(town, settings("stopper", max_attempts=2), fail={2: -1})
        task = asyncio.create_task(broken.run())
        with pytest.raises(PluginStoppedError, match="event 2 failed 2 times"):
            await asyncio.wait_for(task, 30)
        assert broken.seqs() == [1, 2, 2]
        assert await recorded_position(nc, "stopper") == 1  # it stands before the event
        mended = Recorder(town, settings("stopper", max_attempts=2))
        async with running(mended):
            await assert_eventually(lambda: mended.last_seq == 4)
        assert mended.seqs() == [2, 3, 4]


# ---- exactly once through the idempotence helper, under SIGKILL ------------------------------------


def _append(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


class LedgerPlugin(Plugin):
    """A plugin with a side effect: one ledger line per event, through ``once``. When told an earlier
    attempt was interrupted it checks the ledger before writing, as a plugin with a checkable side effect
    does. What the helper told it is written beside the ledger, so tests can see the paths taken."""

    def __init__(self, town: TownConfig, ledger: Path) -> None:
        super().__init__(town, settings("ledger", batch=8))
        self.ledger = ledger

    async def handle(self, seq: int, env: Envelope, payload: Event | None) -> None:
        async with self.once(env.id) as claim:
            line = f"{seq} {env.id}\n"
            if not claim.first:
                _append(self.ledger.with_suffix(".repeated"), line)
                return
            if claim.interrupted:
                _append(self.ledger.with_suffix(".interrupted"), line)
                if line.strip() in _lines(self.ledger):
                    return
            _append(self.ledger, line)


def ledger_main(argv: Sequence[str]) -> int:
    """``python -c 'from tests.integration.test_plugins import ledger_main; ...' --nats-url URL LEDGER``"""
    parser = plugin_parser("ledger", "A test plugin writing one ledger line per event.")
    parser.add_argument("ledger", type=Path)
    args = parser.parse_args(argv)
    return run_plugin("ledger", args, lambda cfg: LedgerPlugin(cfg, args.ledger))


LEDGER_CODE = "import sys; from tests.integration.test_plugins import ledger_main; sys.exit(ledger_main(sys.argv[1:]))"


@contextlib.contextmanager
def spawned(args: list[str], env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real process (stderr to ``log_path``), killed if the test leaves it running."""
    with log_path.open("ab") as out:
        proc = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def exited(proc: subprocess.Popen[bytes], *, timeout: float = 30) -> int:
    """The process's exit code (negative: the signal that killed it), once it has exited."""
    await assert_eventually(lambda: proc.poll() is not None, timeout=timeout)
    return proc.returncode


async def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    return await exited(proc)


def has_lines(path: Path, count: int) -> Callable[[], bool]:
    return lambda: len(_lines(path)) >= count


def ledger_ids(ledger: Path) -> list[str]:
    return [line.split()[1] for line in _lines(ledger)]


async def event_ids(nc: Client) -> list[str]:
    return [msgspec.json.decode(data)["id"] for _, _, data in await read_all(nc, "GT_EVT")]


class TestExactlyOnce:
    @pytest.mark.parametrize(
        ("point", "told"),
        [
            ("plugin_mark_begun", "interrupted"),  # begun recorded, no side effect yet
            ("plugin_side_effect_done", "interrupted"),  # side effect done, not recorded as done
            ("plugin_handled", "repeated"),  # done recorded, not acknowledged
        ],
    )
    async def test_a_plugin_killed_at_each_point_and_restarted_acts_on_every_event_once(
        self,
        nc: Client,
        town: TownConfig,
        log: Appender,
        gt_env: dict[str, str],
        tmp_path: Path,
        point: str,
        told: str,
    ) -> None:
        await store(log, *beads(1, 20))
        ledger = tmp_path / "ledger.txt"
        command = [sys.executable, "-c", LEDGER_CODE, "--nats-url", town.nats_url, "--log-json", str(ledger)]
        crashing = {**gt_env, "GT_CRASH_AT": point, "GT_CRASH_MARKER": str(tmp_path / "crashed")}
        with spawned(command, crashing, tmp_path / "ledger-1.log") as first:
            assert await exited(first) == -signal.SIGKILL
        assert (tmp_path / "crashed").exists()
        # It died at the first event: before its line, or after it.
        assert len(_lines(ledger)) == (0 if point == "plugin_mark_begun" else 1)
        with spawned(command, gt_env, tmp_path / "ledger-2.log") as second:
            await assert_eventually(lambda: len(_lines(ledger)) >= 20)
            await all_recorded(nc, "ledger", 20)
            assert await stop(second) == 0
        ids = await event_ids(nc)
        assert ledger_ids(ledger) == ids  # every event, once, in log order
        # The event it died on really came again, and the helper's answer is what kept it single.
        assert _lines(ledger.with_suffix(f".{told}")) == [f"1 {ids[0]}"]
        other = "repeated" if told == "interrupted" else "interrupted"
        assert _lines(ledger.with_suffix(f".{other}")) == []

    async def test_a_plugin_sigkilled_again_and_again_mid_stream_acts_on_every_event_once(
        self, nc: Client, town: TownConfig, log: Appender, gt_env: dict[str, str], tmp_path: Path
    ) -> None:
        ledger = tmp_path / "ledger.txt"
        command = [sys.executable, "-c", LEDGER_CODE, "--nats-url", town.nats_url, "--log-json", str(ledger)]
        total = 240

        async def produce() -> None:
            for start in range(1, total + 1, 8):
                await store(log, *beads(start, 8))
                # Stay a little ahead of the plugin, so that it is killed while events keep arriving.
                await assert_eventually(has_lines(ledger, start - 40), timeout=60)

        producer = asyncio.create_task(produce())
        kills = 0
        for round_ in range(3):
            with spawned(command, gt_env, tmp_path / f"ledger-{round_}.log") as proc:
                await assert_eventually(has_lines(ledger, len(_lines(ledger)) + 25))
                proc.send_signal(signal.SIGKILL)
                assert await exited(proc) == -signal.SIGKILL
                kills += 1
        assert not producer.done()
        with spawned(command, gt_env, tmp_path / "ledger-last.log") as last:
            await producer
            await assert_eventually(has_lines(ledger, total), timeout=60)
            await all_recorded(nc, "ledger", total)
            assert await stop(last) == 0
        assert kills == 3
        assert ledger_ids(ledger) == await event_ids(nc)
        assert len(set(ledger_ids(ledger))) == total


# ---- the archiver ---------------------------------------------------------------------------------


def envelope(seq: int) -> bytes:
    return encode_event(
        BeadCreated(bead_id=f"hq-{seq:06d}", title=f"bead {seq}"), event_id=f"ev-{seq}", ts=T0, actor="test"
    )


def written(directory: Path, seqs: range, **limits: Any) -> ArchiveWriter:
    writer = ArchiveWriter(directory, **{"max_bytes": 0, "max_age_s": 0.0, **limits})
    writer.open()
    for seq in seqs:
        assert writer.append(seq, f"gt.evt.bead.hq-{seq:06d}", envelope(seq))
    writer.close()
    return writer


class TestArchiveFiles:
    def test_rotated_files_read_back_as_one_log_byte_for_byte(self, tmp_path: Path) -> None:
        written(tmp_path, range(1, 21), max_bytes=600)
        files = archive_files(tmp_path)
        assert len(files) > 3
        assert [p.name for p in files][:1] == [file_name(1)]
        assert all(p.stat().st_size <= 600 for p in files)
        events = list(read_archive(tmp_path))
        assert [(e.seq, e.data) for e in events] == [(seq, envelope(seq)) for seq in range(1, 21)]

    def test_a_restarted_writer_cuts_a_torn_line_and_continues(self, tmp_path: Path) -> None:
        written(tmp_path, range(1, 6))
        [path] = archive_files(tmp_path)
        torn = encode_line(6, "gt.evt.bead.hq-000006", envelope(6))
        with path.open("ab") as out:
            out.write(torn[:30])  # what a kill in the middle of a buffered write leaves
        assert [e.seq for e in read_archive(tmp_path)] == [1, 2, 3, 4, 5]  # a reader skips it meanwhile
        writer = ArchiveWriter(tmp_path, max_bytes=0, max_age_s=0.0)
        assert writer.open() == 5
        assert path.read_bytes().endswith(b"\n")
        assert not writer.append(5, "gt.evt.bead.hq-000005", envelope(5))  # a redelivery: already there
        assert writer.append(6, "gt.evt.bead.hq-000006", envelope(6))
        writer.close()
        assert [e.seq for e in read_archive(tmp_path)] == [1, 2, 3, 4, 5, 6]

    def test_an_empty_file_left_by_a_rotation_is_removed(self, tmp_path: Path) -> None:
        written(tmp_path, range(1, 4))
        (tmp_path / file_name(4)).touch()
        writer = ArchiveWriter(tmp_path, max_bytes=0, max_age_s=0.0)
        assert writer.open() == 3
        assert [p.name for p in archive_files(tmp_path)] == [file_name(1)]
        writer.close()

    def test_age_rotation_follows_event_time_so_files_do_not_depend_on_restarts(self, tmp_path: Path) -> None:
        def at(minute: int) -> bytes:
            return encode_event(
                BeadCreated(bead_id="hq-1", title="t"),
                event_id=f"ev-{minute}",
                ts=T0 + timedelta(minutes=minute),
                actor="test",
            )

        once = ArchiveWriter(tmp_path / "once", max_bytes=0, max_age_s=3600)
        once.open()
        for seq, minute in enumerate((0, 30, 59, 60, 100, 125), 1):
            once.append(seq, "gt.evt.bead.hq-1", at(minute))
        once.close()
        restarted = tmp_path / "restarted"
        for seq, minute in enumerate((0, 30, 59, 60, 100, 125), 1):
            writer = ArchiveWriter(restarted, max_bytes=0, max_age_s=3600)
            writer.open()
            writer.append(seq, "gt.evt.bead.hq-1", at(minute))
            writer.close()
        # Minutes 0, 30, 59 | 60, 100 | 125: a file spans less than an hour of its events' time.
        expected = [file_name(1), file_name(4), file_name(6)]
        assert [p.name for p in archive_files(tmp_path / "once")] == expected
        assert [p.name for p in archive_files(restarted)] == expected

    def test_a_hole_or_damage_is_an_error_not_a_silent_skip(self, tmp_path: Path) -> None:
        writer = ArchiveWriter(tmp_path / "hole", max_bytes=0, max_age_s=0.0)
        writer.open()
        writer.append(1, "gt.evt.bead.hq-1", envelope(1))
        with pytest.raises(ArchiveOrderError, match="expected 2"):
            writer.append(3, "gt.evt.bead.hq-3", envelope(3))
        writer.close()
        written(tmp_path / "gap", range(1, 3))
        (tmp_path / "gap" / file_name(4)).write_bytes(encode_line(4, "gt.evt.bead.hq-4", envelope(4)))
        with pytest.raises(ArchiveOrderError, match="sequence 4, expected 3"):
            list(read_archive(tmp_path / "gap"))
        damaged = tmp_path / "damaged"
        written(damaged, range(1, 4))
        [path] = archive_files(damaged)
        lines = path.read_bytes().splitlines(keepends=True)
        path.write_bytes(lines[0] + b"{not a line}\n" + lines[2])
        with pytest.raises(ArchiveCorruptError, match=r"events-000000000001\.jsonl:2"):
            list(read_archive(damaged))
        path.write_bytes(lines[0] + lines[1] + b"{not a line}\n")
        with pytest.raises(ArchiveCorruptError, match=":3"):
            # The writer does not guess past a damaged complete line: the archiver stops with this error.
            ArchiveWriter(damaged, max_bytes=0, max_age_s=0.0).open()


CREATE = "gt.cmd.bead.create"


async def workload(driver: Driver, tag: str) -> None:
    """What operators and agents send a mayor: beads through their statuses, a molecule's steps, mail, an
    escalation, a convoy, and a rejected command (its outcome is an event too)."""
    ids = [(await driver.send(CREATE, {"title": f"{tag} {n}", "priority": n % 4}))["id"] for n in range(4)]
    await driver.send("gt.cmd.bead.update", {"id": ids[0], "labels": ["audit"], "needs": [ids[1]]})
    await driver.send("gt.cmd.bead.sling", {"id": ids[2], "rig": "demo"})
    await driver.send("gt.cmd.step.start", {"bead": ids[2], "step": "load-context"})
    await driver.send("gt.cmd.step.done", {"bead": ids[2], "step": "load-context"})
    await driver.send("gt.cmd.bead.claim", {"id": ids[3], "assignee": "polecat:demo/ace"})
    await driver.send("gt.cmd.bead.close", {"id": ids[1], "reason": "done"})
    await driver.send("gt.cmd.mail.send", {"to": "mayor", "body": f"{tag}: all good"})
    await driver.send("gt.cmd.escalation.raise", {"severity": "high", "message": f"{tag} needs a hand"})
    await driver.send("gt.cmd.convoy.create", {"title": f"{tag} convoy", "beads": [ids[0]]})
    with pytest.raises(CommandError):
        await driver.send("gt.cmd.bead.close", {"id": "hq-nosuch"})


def archived_up_to(directory: Path, seq: int) -> Callable[[], bool]:
    def check() -> bool:
        events = list(read_archive(directory)) if directory.exists() else []
        return bool(events) and events[-1].seq >= seq

    return check


class TestArchiver:
    async def test_the_archive_replays_to_the_same_mayor_projection_as_the_log(
        self, nc: Client, town: TownConfig, gt_env: dict[str, str], tmp_path: Path
    ) -> None:
        archive = tmp_path / "archive"
        command = [
            sys.executable,
            "-m",
            "services.plugins.archiver",
            "--nats-url",
            town.nats_url,
            "--dir",
            str(archive),
            "--max-bytes",
            "4096",
            "--fsync-interval",
            "0.1",
            "--log-json",
        ]
        async with nats_driver(town, nc) as driver:
            await workload(driver, "before")
            with spawned(command, gt_env, tmp_path / "archiver-1.log") as first:
                await assert_eventually(archived_up_to(archive, await stream_last(nc)))
                await workload(driver, "during")
                first.send_signal(signal.SIGKILL)  # lines in its write buffer die with it, acknowledged or not
                assert await exited(first) == -signal.SIGKILL
            await workload(driver, "while down")
            # Once more, right after a line is written and before it is acknowledged.
            crashing = {**gt_env, "GT_CRASH_AT": "archiver_line_written", "GT_CRASH_MARKER": str(tmp_path / "crashed")}
            with spawned(command, crashing, tmp_path / "archiver-2.log") as second:
                assert await exited(second) == -signal.SIGKILL
            with spawned(command, gt_env, tmp_path / "archiver-3.log") as third:
                await assert_eventually(logged(tmp_path / "archiver-3.log", "plugin_positioned"))
                [ready] = log_entries(tmp_path / "archiver-3.log", "plugin_positioned")
                # Its predecessor died mid-batch: it reads on from its files' end, whatever position it recorded.
                assert ready["reason"] == "plugin_record"
                [opened] = log_entries(tmp_path / "archiver-3.log", "archive_opened")
                assert ready["start_seq"] == opened["last_seq"] + 1
                await workload(driver, "after")
                await driver.settle()
                await assert_eventually(archived_up_to(archive, await stream_last(nc)))
                assert await stop(third) == 0
        # The mayor is stopped, so the log is final; one more start finds its files complete or completes them.
        last = await stream_last(nc)
        with spawned(command, gt_env, tmp_path / "archiver-4.log") as last_run:
            await assert_eventually(logged(tmp_path / "archiver-4.log", "plugin_caught_up"))
            await assert_eventually(archived_up_to(archive, last))
            assert await stop(last_run) == 0

        events = list(read_archive(archive))
        assert [e.seq for e in events] == list(range(1, last + 1))  # no line lost, none twice
        stored = await read_all(nc, "GT_EVT")
        assert [(e.seq, e.subject, e.data) for e in events] == stored  # the envelopes as stored, byte for byte
        assert len(archive_files(archive)) > 3  # it rotated

        from_archive = new_projection()
        for event in events:
            from_archive.apply(event.seq, event.subject, event.data)
        from_log = await fresh_replay(nc, new_projection())
        assert digest(from_archive) == digest(from_log)
        assert len(from_archive.state.beads) == 4 * 4 + 4  # 4 workloads x 4 beads, and 4 messages


# ---- the metrics exporter -------------------------------------------------------------------------


def http_get(url: str) -> tuple[int, str, str]:
    """(status, content type, body) with the standard library's HTTP client, as a scraper would."""
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample line; comment lines must be HELP or TYPE."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert line.split(" ", 2)[1] in ("HELP", "TYPE"), line
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def log_entries(log_path: Path, event: str) -> list[dict[str, Any]]:
    """The JSON log lines of ``event`` a process has written so far."""
    found = []
    for line in log_path.read_text().splitlines() if log_path.exists() else []:
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and entry.get("event") == event:
                found.append(entry)
    return found


def logged(log_path: Path, event: str) -> Callable[[], bool]:
    return lambda: bool(log_entries(log_path, event))


def logged_port(log_path: Path) -> int | None:
    entries = log_entries(log_path, "metrics_listening")
    return int(entries[0]["port"]) if entries else None


class TestMetricsExporter:
    async def test_a_scrape_reports_the_town_after_a_workload(
        self, nc: Client, town: TownConfig, log: Appender
    ) -> None:
        async with nats_driver(town, nc) as driver:
            await workload(driver, "m")
            # Sessions and merge requests as the witness and the refinery store them.
            await store(
                log,
                session("s-1"),
                session("s-2"),
                SessionStarted(session_id="s-1", pane_pid=101, pid_started=1.5),
                SessionEnded(session_id="s-2", reason="dead"),
                submitted("mr-1", "demo"),
                submitted("mr-2", "demo"),
                submitted("mr-3", "other"),
                MergeRequestClaimed(mr_id="mr-1", attempt=1, holder="refinery", lease_until=T0),
            )
            await driver.settle()
            last = await stream_last(nc)
            plugin = MetricsPlugin(town, MetricsOptions(port=0, services=("mayor", "witness")))
            async with running(plugin):
                await asyncio.wait_for(plugin.listening.wait(), 30)
                assert plugin.server is not None
                url = f"http://127.0.0.1:{plugin.server.port}"

                async def scraped() -> dict[str, float]:
                    status, content_type, body = await asyncio.to_thread(http_get, url + "/metrics")
                    assert (status, content_type) == (200, "text/plain; version=0.0.4; charset=utf-8")
                    got = samples(body)
                    caught_up = got.get('gt_plugin_last_seq{plugin="metrics"}') == last
                    return got if caught_up and got.get('gt_projection_lag{service="mayor"}') == 0 else {}

                got: dict[str, float] = await assert_eventually(scraped)
                assert (await asyncio.to_thread(http_get, url + "/nope"))[0] == 404
                mayor_beads = [bead.status for bead in driver.service.projection.state.beads.values()]

        by_type: dict[str, int] = {}
        for _, _, data in await read_all(nc, "GT_EVT"):
            kind = json.loads(data)["type"]
            by_type[kind] = by_type.get(kind, 0) + 1
        assert {k: int(v) for k, v in got.items() if k.startswith("gt_events_total{")} == {
            f'gt_events_total{{type="{kind}"}}': count for kind, count in by_type.items()
        }
        for status in ("open", "hooked", "in_progress", "closed"):  # the same as the mayor's own view
            assert got[f'gt_beads{{status="{status}"}}'] == mayor_beads.count(status)
        assert got['gt_beads{status="closed"}'] == 1
        assert (got['gt_sessions{state="requested"}'], got['gt_sessions{state="started"}']) == (0, 1)
        assert got['gt_sessions{state="ended"}'] == 1
        assert got['gt_merge_queue_depth{rig="demo"}'] == 2
        assert got['gt_merge_queue_depth{rig="other"}'] == 1
        assert got["gt_stream_last_seq"] == last
        assert got['gt_service_up{service="mayor"}'] == 1
        assert got['gt_service_up{service="witness"}'] == 0  # not running
        assert 'gt_projection_lag{service="witness"}' not in got
        # The mayor's own figures, from its status: what it applied and how its patrols went.
        assert got['gt_service_events_applied_total{service="mayor"}'] >= last
        assert got['gt_service_patrols_total{service="mayor"}'] >= 1
        assert (
            got['gt_service_patrol_seconds_total{service="mayor"}']
            >= got['gt_service_patrol_max_seconds{service="mayor"}']
        )
        assert 'gt_service_patrols_total{service="witness"}' not in got

    async def test_the_exporter_process_logs_its_port_serves_and_stops_on_sigterm(
        self, nc: Client, town: TownConfig, log: Appender, gt_env: dict[str, str], tmp_path: Path
    ) -> None:
        await store(log, *beads(1, 3))
        log_path = tmp_path / "metrics.log"
        command = [
            sys.executable,
            "-m",
            "services.plugins.metrics",
            "--nats-url",
            town.nats_url,
            "--port",
            "0",
            "--services",
            "mayor",
            "--log-json",
        ]
        with spawned(command, gt_env, log_path) as proc:
            port = await assert_eventually(lambda: logged_port(log_path))
            url = f"http://127.0.0.1:{port}/metrics"

            async def three_beads() -> dict[str, float]:
                got = samples((await asyncio.to_thread(http_get, url))[2])
                return got if got.get('gt_events_total{type="bead.created"}') == 3 else {}

            got: dict[str, float] = await assert_eventually(three_beads)
            assert got['gt_service_up{service="mayor"}'] == 0
            assert got['gt_beads{status="open"}'] == 3
            assert await stop(proc) == 0


def submitted(mr_id: str, rig: str) -> MergeRequestSubmitted:
    return MergeRequestSubmitted(
        mr_id=mr_id, bead="hq-x", rig=rig, branch="polecat/ace/hq-x", target="main", head=mr_id.encode().hex() * 10
    )


def session(session_id: str) -> SessionRequested:
    return SessionRequested(
        session_id=session_id,
        rig="demo",
        polecat="ace",
        bead="hq-x",
        worktree="/w/ace",
        branch="polecat/ace/hq-x",
        tmux_name="gt-demo-ace",
        attempt=1,
    )


# ---- a plugin in another language -----------------------------------------------------------------

SUBSCRIBER = '''\
"""A plugin as another language would write it: a NATS client and a JSON parser, nothing of gastown-nats. It follows
the log as the plugin user may (docs/plugins.md): batched direct gets of GT_EVT from the last sequence it handled."""
import asyncio
import json
import sys

import nats


async def read_batch(nc, from_seq, batch):
    """(seq, subject, data) of up to `batch` events from `from_seq`: the messages, then a status (204 EOB, or
    404 when there is nothing there yet). Each message names its predecessor: a hole means one was lost."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    request = json.dumps({"seq": from_seq, "batch": batch}).encode()
    await nc.publish("$JS.API.DIRECT.GET.GT_EVT", request, reply=inbox)
    got = []
    try:
        while True:
            msg = await sub.next_msg(timeout=5)
            headers = msg.headers or {}
            if "Nats-Sequence" not in headers:
                return got
            before = int(headers["Nats-Last-Sequence"])
            if before != (got[-1][0] if got else 0):
                return got  # a message was lost on the way: read on from the last one kept
            got.append((int(headers["Nats-Sequence"]), headers["Nats-Subject"], msg.data))
    finally:
        await sub.unsubscribe()


async def main(url: str, last_seq: int) -> None:
    nc = await nats.connect(url)
    seen = []
    position = 0  # a real plugin keeps this in its marks: $KV.GT_PLUGINS.<name>.position.last
    while position < last_seq:
        batch = await read_batch(nc, position + 1, 16)
        if not batch:
            await asyncio.sleep(0.05)  # caught up: look again soon
            continue
        for seq, subject, data in batch:
            envelope = json.loads(data)
            seen.append({
                "seq": seq,
                "subject": subject,
                "id": envelope["id"],
                "type": envelope["type"],
                "v": envelope.get("v", 1),  # gt schema: v defaults to 1 when absent
                "ts": envelope["ts"],
                "actor": envelope["actor"],
                "data": envelope["data"],
            })
            position = seq
    await nc.close()
    ours = sorted(m for m in sys.modules if m.split(".")[0] in ("shared", "services", "tests"))
    print(json.dumps({"events": seen, "imported": ours}))


asyncio.run(main(sys.argv[1], int(sys.argv[2])))
'''


def payload_schema(schema: dict[str, Any], kind: str) -> dict[str, Any]:
    documented = schema["events"][kind]["data"]
    name = documented["$ref"].rsplit("/", 1)[-1]
    found: dict[str, Any] = documented["$defs"][name]
    return found


class TestOtherLanguages:
    async def test_a_plain_nats_subscriber_reads_the_log_with_only_the_subjects_and_gt_schema(
        self, nc: Client, town: TownConfig, gt_env: dict[str, str], tmp_path: Path
    ) -> None:
        printed = subprocess.run(
            [sys.executable, "-m", "gt.cli.main", "schema"], cwd=REPO_ROOT, env=gt_env, capture_output=True
        )
        assert printed.returncode == 0, printed.stderr
        schema = json.loads(printed.stdout)
        envelope = schema["envelope"]["$defs"]["Envelope"]
        assert {"id", "type", "ts", "actor", "data"} <= set(envelope["required"])  # what the script reads
        assert envelope["properties"]["v"]["default"] == 1  # and what it assumes when v is absent

        async with nats_driver(town, nc) as driver:
            await workload(driver, "foreign")
            await driver.settle()
        last = await stream_last(nc)
        script = tmp_path / "subscriber.py"
        script.write_text(SUBSCRIBER)
        plain_env = {key: value for key, value in gt_env.items() if key != "PYTHONPATH"}
        result = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(script), town.nats_url, str(last)],
            cwd=tmp_path,
            env=plain_env,
            capture_output=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr.decode()
        out = json.loads(result.stdout)
        assert out["imported"] == []
        seen = out["events"]

        stored = await read_all(nc, "GT_EVT")
        assert [(e["seq"], e["subject"], e["id"]) for e in seen] == [
            (seq, subject, json.loads(data)["id"]) for seq, subject, data in stored
        ]
        for event in seen:
            documented = schema["events"][event["type"]]
            assert event["v"] == documented["v"]
            assert event["subject"].startswith(documented["subject"].removesuffix("<id>"))
            fields = payload_schema(schema, event["type"])
            assert set(event["data"]) <= set(fields["properties"]), event["type"]
            assert set(fields.get("required", [])) <= set(event["data"]), event["type"]
        titles = [e["data"]["title"] for e in seen if e["type"] == "bead.created"]
        assert [t for t in titles if t.startswith("foreign ")] == [f"foreign {n}" for n in range(4)]
        kinds = {e["type"] for e in seen}
        assert {"bead.created", "bead.closed", "cmd.accepted", "cmd.rejected", "molecule.attached"} <= kinds
