"""The direct reader (shared/bus/direct_reader.py), the gate runners' way of following the log, on a real nats-server:
only the events on its filter, in order, each once; its position at the log's end even when nothing there was on
the filter; a wait for a sequence read at once; and no event skipped when the server answering its batched direct
gets lags the stream's leader (any replica answers a direct get: here one that has not got the newest events yet,
standing in for a lagging replica of a cluster)."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client

from shared.bus import log_read
from shared.bus.connection import Connection
from shared.bus.direct_reader import DirectReader
from shared.bus.topology import provision
from shared.core.config import TownConfig
from tests.helpers import assert_eventually

GATES = "gt.evt.gate.>"


@pytest.fixture
async def log(town: TownConfig, nc: Client) -> Client:
    await provision(nc, town)
    return nc


async def append(nc: Client, *subjects: str) -> list[int]:
    js = nc.jetstream()
    return [int((await js.publish(subject, f"{subject}#{n}".encode(), stream="GT_EVT")).seq) for n, subject in
            enumerate(subjects)]  # fmt: skip


class Following:
    """A reader of the gate events, running in a task of this loop."""

    def __init__(self, nc: Connection, start_after: int = 0) -> None:
        self.applied: list[tuple[int, str]] = []
        self.passed: list[int] = []
        self.reader = DirectReader(
            nc, "GT_EVT", self._apply, subject=GATES, passed=self.passed.append, start_after=start_after, poll_s=0.02
        )

    def _apply(self, seq: int, subject: str, data: bytes) -> None:
        self.applied.append((seq, subject))


async def test_it_applies_the_filters_events_in_order_and_stands_at_the_logs_end(log: Client) -> None:
    seqs = await append(log, "gt.evt.gate.a", "gt.evt.bead.x", "gt.evt.gate.b", "gt.evt.mr.y", "gt.evt.bead.z")
    following = Following(log)
    task = asyncio.create_task(following.reader.run())
    try:
        await asyncio.wait_for(following.reader.caught_up.wait(), 10)
        assert following.applied == [(seqs[0], "gt.evt.gate.a"), (seqs[2], "gt.evt.gate.b")]
        assert following.reader.last_seq == seqs[-1], "read past what is not on the filter, to the log's end"
        assert following.passed[-1] == seqs[-1]

        # A wait for what was just stored is read at once, whatever is on the filter.
        more = await append(log, "gt.evt.bead.w", "gt.evt.gate.c", "gt.evt.bead.v")
        await asyncio.wait_for(following.reader.wait_for_seq(more[-1]), 10)
        assert following.applied[-1] == (more[1], "gt.evt.gate.c")
        assert len(following.applied) == 3, "each once"
        # And it follows by itself.
        last = await append(log, "gt.evt.gate.d")
        await assert_eventually(lambda: following.applied[-1] == (last[0], "gt.evt.gate.d"), timeout=10)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_reader_started_after_a_sequence_reads_on_from_there(log: Client) -> None:
    seqs = await append(log, "gt.evt.gate.a", "gt.evt.gate.b", "gt.evt.bead.x", "gt.evt.gate.c")
    following = Following(log, start_after=seqs[1])
    task = asyncio.create_task(following.reader.run())
    try:
        await asyncio.wait_for(following.reader.caught_up.wait(), 10)
        assert following.applied == [(seqs[3], "gt.evt.gate.c")]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_server_answering_behind_the_leader_skips_nothing(log: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    seqs = await append(log, "gt.evt.gate.a", "gt.evt.bead.x", "gt.evt.gate.b", "gt.evt.bead.y", "gt.evt.gate.c")
    real = log_read.read_batch
    behind = seqs[1]
    """The newest sequence the lagging server has: it answers as if nothing after it were stored yet."""

    async def lagging(
        nc: Connection, stream: str, from_seq: int, batch: int, max_bytes: int, **kw: str
    ) -> log_read.Batch:
        got = await real(nc, stream, from_seq, batch, max_bytes, **kw)  # type: ignore[arg-type]
        return log_read.Batch([m for m in got.messages if m.seq <= behind], 0)

    monkeypatch.setattr(log_read, "read_batch", lagging)
    following = Following(log)
    task = asyncio.create_task(following.reader.run())
    try:
        await asyncio.wait_for(following.reader.caught_up.wait(), 10)
        assert following.applied == [(seqs[0], "gt.evt.gate.a"), (seqs[2], "gt.evt.gate.b"), (seqs[4], "gt.evt.gate.c")]
        assert following.reader.lagging == 2, "the two the lagging server did not have came from the leader"
        assert following.reader.last_seq == seqs[-1]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
