"""A polecat session's ``gt`` call keeps its session alive while it waits (gt/cli/hook_lease.py ``kept_alive``), and
only while it waits: once the call is done its beats stop, even when the cancel that stops them lands in a NATS
call that swallows it (nats-py's flush does). Found by the 1,000-bead chaos run: a `gt prime` answered long before
went on beating for over half an hour, and its session looked alive all that time."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gt.cli import hook_lease
from shared.core.config import TownConfig


async def test_the_beats_stop_with_the_call_even_when_a_beat_swallows_the_cancel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    beats: list[str] = []
    beating = asyncio.Event()

    async def swallowing_put(_nc: object, _config: object, session: str, _data: bytes) -> None:
        beats.append(session)
        beating.set()
        with contextlib.suppress(asyncio.CancelledError):  # as nats-py's _flush_pending does
            await asyncio.sleep(0.5)

    monkeypatch.setattr(hook_lease, "put_agent_heartbeat", swallowing_put)
    monkeypatch.setattr(hook_lease, "KEEP_ALIVE_EVERY_S", 0.01)
    monkeypatch.setattr(hook_lease, "session_fence", lambda: None)
    monkeypatch.setenv("GT_SESSION", "hq-abc123-1")

    async def call() -> int:
        await beating.wait()  # the call ends while a beat is under way: the cancel lands in it
        return 7

    kept = hook_lease.kept_alive(None, TownConfig(), call())  # type: ignore[arg-type]
    assert await asyncio.wait_for(kept, timeout=10) == 7
    count = len(beats)
    await asyncio.sleep(0.2)  # an absence: twenty rounds' worth
    assert len(beats) == count, "no beat after the call ended"
