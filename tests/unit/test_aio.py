"""Cancellation survives libraries that swallow it (asyncio.wait_for on Python 3.11)."""

from __future__ import annotations

import asyncio

import pytest

from shared.core.aio import KeyedLocks, pause, raise_if_cancelling, wait_event


async def test_wait_event_reports_set_or_timed_out() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, 0.01) is True
    assert await wait_event(event, None) is True


async def test_a_loop_stops_even_when_a_library_swallowed_its_cancellation() -> None:
    rounds = 0
    running = asyncio.Event()

    async def swallowing_call() -> None:
        # What asyncio.wait_for does on 3.11 when the awaited thing finishes as the task is cancelled.
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            return

    async def loop() -> None:
        nonlocal rounds
        while True:
            raise_if_cancelling()
            rounds += 1
            if rounds == 3:
                running.set()
            await swallowing_call()

    task = asyncio.create_task(loop())
    await running.wait()  # the loop has gone round a few times
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await task


async def test_wait_event_passes_cancellation_through() -> None:
    event = asyncio.Event()
    task = asyncio.create_task(wait_event(event, 30))
    await asyncio.sleep(0)
    task.cancel()
    event.set()  # the event and the cancellation land in the same iteration
    with pytest.raises(asyncio.CancelledError):
        await task


async def swallow_one_cancel(entered: asyncio.Event) -> None:
    """What asyncio.wait_for does on 3.11 when the awaited reply arrives as the task is cancelled."""
    entered.set()
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        return


@pytest.mark.parametrize("wait", ["pause", "wait_event"])
async def test_the_wait_between_rounds_raises_a_cancel_swallowed_during_the_round(wait: str) -> None:
    entered = asyncio.Event()
    rounds = 0

    async def loop() -> None:
        nonlocal rounds
        while True:
            rounds += 1
            await swallow_one_cancel(entered)
            if wait == "pause":
                await pause(30)
            else:
                await wait_event(asyncio.Event(), 30)

    task = asyncio.create_task(loop())
    await entered.wait()
    task.cancel()  # lands in the round, which swallows it; the loop's wait must not
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await task
    assert rounds == 1


async def test_pause_sleeps_when_nothing_was_cancelled() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    await pause(0.02)
    assert loop.time() - started >= 0.02


async def test_keyed_locks_exclude_per_key_and_forget_a_key_nobody_holds() -> None:
    locks = KeyedLocks()
    order: list[str] = []
    held = asyncio.Event()

    async def first() -> None:
        async with locks.hold("a"):
            order.append("a1 in")
            held.set()
            await asyncio.sleep(0.01)
            order.append("a1 out")

    async def second() -> None:
        await held.wait()
        async with locks.hold("a"):
            order.append("a2 in")

    async def other() -> None:
        await held.wait()
        async with locks.hold("b"):
            order.append("b in")

    await asyncio.gather(first(), second(), other())
    assert order == ["a1 in", "b in", "a1 out", "a2 in"], "b did not wait for a; the second a waited for the first"
    assert len(locks) == 0

    with pytest.raises(RuntimeError):
        async with locks.hold("c"):
            raise RuntimeError("boom")
    assert len(locks) == 0, "released and forgotten on an error too"
