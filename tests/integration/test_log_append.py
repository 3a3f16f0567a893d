"""Appending to the real log: per-aggregate concurrency, atomic groups, and retries that never store twice."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from nats.aio.client import Client

from shared.bus.append import Appender, PendingEvent
from shared.bus.commit import GroupCommitter
from shared.bus.topology import provision
from shared.core.config import TownConfig
from shared.core.errors import AppendConflictError, AppendFailedError
from shared.model.events import BeadClosed, BeadCreated, decode_envelope, encode_event

TS = datetime(2026, 5, 1, tzinfo=UTC)


def created(bead_id: str, event_id: str, expected: int | None = 0) -> PendingEvent:
    data = encode_event(BeadCreated(bead_id=bead_id, title="t"), event_id=event_id, ts=TS, actor="test")
    return PendingEvent(subject=f"gt.evt.bead.{bead_id}", data=data, event_id=event_id, expected_seq=expected)


def closed(bead_id: str, event_id: str, expected: int | None) -> PendingEvent:
    data = encode_event(BeadClosed(bead_id=bead_id), event_id=event_id, ts=TS, actor="test")
    return PendingEvent(subject=f"gt.evt.bead.{bead_id}", data=data, event_id=event_id, expected_seq=expected)


async def stored_events(nc: Client, town: TownConfig) -> list[tuple[int, str, str]]:
    """(seq, subject, event id) of everything in GT_EVT, read message by message."""
    js = nc.jetstream()
    info = await js.stream_info(town.evt_stream)
    out = []
    for seq in range(int(info.state.first_seq), int(info.state.last_seq) + 1):
        msg = await js.get_msg(town.evt_stream, seq)
        out.append((seq, msg.subject or "", decode_envelope(msg.data or b"").id))
    return out


class _LoseAcks:
    """Fault injection on a real connection: the request reaches the server, its answer is 'lost'."""

    def __init__(self, nc: Client, losses: int) -> None:
        self._nc = nc
        self._request = nc.request
        self.losses = losses

    async def request(self, *args: Any, **kwargs: Any) -> Any:
        reply = await self._request(*args, **kwargs)
        if self.losses > 0:
            self.losses -= 1
            raise TimeoutError("acknowledgement lost (injected)")
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nc, name)


@pytest.fixture
async def appender(nc: Client, town: TownConfig) -> Appender:
    await provision(nc, town)
    return Appender(nc, town.evt_stream, attempt_timeout=2, deadline=20)


class TestConcurrency:
    async def test_create_if_absent_then_a_second_create_conflicts(self, appender: Appender) -> None:
        [seq] = await appender.append([created("hq-1", "e1", expected=0)])
        with pytest.raises(AppendConflictError) as info:
            await appender.append([created("hq-1", "e2", expected=0)])
        assert info.value.subject == "gt.evt.bead.hq-1"
        assert info.value.expected == 0
        assert info.value.actual == seq

    async def test_an_append_on_a_stale_version_conflicts_and_names_the_current_one(self, appender: Appender) -> None:
        [v1] = await appender.append([created("hq-1", "e1")])
        [v2] = await appender.append([closed("hq-1", "e2", expected=v1)])
        with pytest.raises(AppendConflictError) as info:
            await appender.append([closed("hq-1", "e3", expected=v1)])
        assert (info.value.expected, info.value.actual) == (v1, v2)

    async def test_other_aggregates_do_not_conflict(self, appender: Appender) -> None:
        await appender.append([created("hq-1", "e1")])
        results = await asyncio.gather(*(appender.append([created(f"hq-{i}", f"e{i}")]) for i in range(2, 40)))
        assert len({seq for [seq] in results}) == 38

    async def test_a_batch_is_stored_whole_or_not_at_all(
        self, nc: Client, town: TownConfig, appender: Appender
    ) -> None:
        await appender.append([created("hq-1", "e1")])
        with pytest.raises(AppendConflictError):
            await appender.append([created("hq-2", "e2"), created("hq-1", "e3"), created("hq-3", "e4")])
        assert [ev for _, _, ev in await stored_events(nc, town)] == ["e1"]
        seqs = await appender.append([created("hq-2", "e5"), created("hq-3", "e6")])
        assert seqs == [2, 3]

    async def test_the_server_refusing_for_another_reason_is_a_typed_failure(self, appender: Appender) -> None:
        huge = PendingEvent(subject="gt.evt.bead.big", data=b"x" * (2 * 1024 * 1024), event_id="big", expected_seq=0)
        with pytest.raises(AppendFailedError) as info:
            await appender.append([huge])
        assert info.value.err_code is not None
        assert "maximum" in info.value.description.lower() or "size" in info.value.description.lower()

    async def test_a_batch_must_end_with_a_checked_event(self, appender: Appender) -> None:
        with pytest.raises(ValueError, match="expected sequence"):
            await appender.append([created("hq-1", "e1"), created("hq-2", "e2", expected=None)])


class TestRetryNeverStoresTwice:
    async def test_a_lost_ack_on_a_checked_append_is_recognised(
        self, nc: Client, town: TownConfig, appender: Appender
    ) -> None:
        lossy = Appender(_LoseAcks(nc, losses=2), town.evt_stream, attempt_timeout=2)  # type: ignore[arg-type]
        [seq] = await lossy.append([created("hq-1", "e1")])
        assert lossy.retries == 2
        assert await stored_events(nc, town) == [(seq, "gt.evt.bead.hq-1", "e1")]

    async def test_a_lost_ack_on_an_unchecked_append_is_deduplicated_by_msg_id(
        self, nc: Client, town: TownConfig, appender: Appender
    ) -> None:
        lossy = Appender(_LoseAcks(nc, losses=1), town.evt_stream, attempt_timeout=2)  # type: ignore[arg-type]
        [seq] = await lossy.append([created("hq-1", "e1", expected=None)])
        assert await stored_events(nc, town) == [(seq, "gt.evt.bead.hq-1", "e1")]

    async def test_a_lost_ack_on_a_batch_is_recognised(self, nc: Client, town: TownConfig, appender: Appender) -> None:
        lossy = Appender(_LoseAcks(nc, losses=1), town.evt_stream, attempt_timeout=2)  # type: ignore[arg-type]
        seqs = await lossy.append([created("hq-1", "e1"), created("hq-2", "e2")])
        assert seqs == [1, 2]
        assert [ev for _, _, ev in await stored_events(nc, town)] == ["e1", "e2"]

    async def test_someone_elses_event_after_a_lost_ack_is_still_a_conflict(
        self, nc: Client, town: TownConfig, appender: Appender
    ) -> None:
        await appender.append([created("hq-1", "theirs")])
        lossy = Appender(_LoseAcks(nc, losses=0), town.evt_stream)  # type: ignore[arg-type]
        with pytest.raises(AppendConflictError):
            await lossy.append([created("hq-1", "mine")])

    async def test_appends_across_a_server_restart_are_all_stored_once(
        self, own_nats_server: Any, tmp_path: Any
    ) -> None:
        import nats

        town = TownConfig(nats_url=own_nats_server.url, gt_home=tmp_path)
        client = await nats.connect(town.nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        try:
            await provision(client, town)
            appender = Appender(client, town.evt_stream, attempt_timeout=1, deadline=60)

            async def write(i: int) -> int:
                [seq] = await appender.append([created(f"hq-{i}", f"e{i}")])
                return seq

            first = await asyncio.gather(*(write(i) for i in range(100)))
            pending = [asyncio.ensure_future(write(i)) for i in range(100, 300)]
            await asyncio.to_thread(own_nats_server.restart)
            rest = await asyncio.gather(*pending)
            stored = await stored_events(client, town)
        finally:
            await client.close()
        counts = Counter(ev for _, _, ev in stored)
        assert set(counts) == {f"e{i}" for i in range(300)}
        assert max(counts.values()) == 1
        assert sorted(first + rest) == [seq for seq, _, _ in stored]


class TestGroupCommitRefusals:
    async def test_an_event_over_the_servers_max_payload_is_refused_and_the_committer_goes_on(
        self, nc: Client, town: TownConfig, appender: Appender
    ) -> None:
        committer = GroupCommitter(appender)
        runner = asyncio.create_task(committer.run())
        try:
            data = b"x" * (5 * 1024 * 1024)
            huge = PendingEvent(subject="gt.evt.bead.big", data=data, event_id="big", expected_seq=0)
            with pytest.raises(AppendFailedError) as info:
                await committer.append([huge])
            assert "max payload" in info.value.description
            assert await committer.append([created("hq-1", "e1")]) == [1]
        finally:
            runner.cancel()

    async def test_too_many_events_for_one_atomic_append_are_refused(self, appender: Appender) -> None:
        committer = GroupCommitter(appender)
        with pytest.raises(ValueError, match="limit"):
            await committer.append([created(f"hq-{i}", f"e{i}") for i in range(1001)])


class TestGroupCommit:
    async def test_concurrent_appends_share_groups(self, nc: Client, town: TownConfig, appender: Appender) -> None:
        committer = GroupCommitter(appender)
        runner = asyncio.create_task(committer.run())
        try:
            results = await asyncio.gather(
                *(committer.append([created(f"hq-{i}", f"e{i}"), created(f"x-{i}", f"o{i}")]) for i in range(500))
            )
        finally:
            runner.cancel()
        assert committer.groups < 500
        stored = await stored_events(nc, town)
        assert len(stored) == 1000
        by_id = {ev: seq for seq, _, ev in stored}
        for i, seqs in enumerate(results):
            assert seqs == [by_id[f"e{i}"], by_id[f"o{i}"]]
            assert seqs[1] == seqs[0] + 1  # one command's events stay together

    async def test_a_conflicting_append_fails_alone_and_its_neighbours_are_stored(
        self, nc: Client, town: TownConfig, appender: Appender
    ) -> None:
        await appender.append([created("hq-taken", "first")])
        committer = GroupCommitter(appender)
        runner = asyncio.create_task(committer.run())
        try:
            results = await asyncio.gather(
                *(committer.append([created(f"hq-{i}", f"e{i}")]) for i in range(50)),
                committer.append([created("hq-taken", "second")]),
                *(committer.append([created(f"hq-{i}", f"e{i}")]) for i in range(50, 100)),
                return_exceptions=True,
            )
        finally:
            runner.cancel()
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 1
        assert isinstance(errors[0], AppendConflictError)
        assert errors[0].subject == "gt.evt.bead.hq-taken"
        stored = {ev for _, _, ev in await stored_events(nc, town)}
        assert stored == {"first"} | {f"e{i}" for i in range(100)}
        assert committer.splits >= 1
