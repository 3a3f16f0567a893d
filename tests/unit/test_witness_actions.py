"""The witness's action queue (``services/witness/effects/actions.py``): one action per key at a time, the most
urgent first, a failed one backed off, its key busy meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from services.witness.effects.actions import ActionQueue
from services.witness.effects.toolkit import StartBlockedError
from services.witness.plan.actions import Action, Clean, Kill, Spawn


class Witness:
    def __init__(self) -> None:
        self.wakes = 0

    async def wait_active(self) -> None:
        return None

    def wake(self) -> None:
        self.wakes += 1


class Runner:
    def __init__(self, fail: type[Exception] | None = None) -> None:
        self.ran: list[str] = []
        self.fail = fail

    async def run(self, action: Action) -> None:
        self.ran.append(action.key)
        if self.fail is not None:
            raise self.fail("it failed")


class _StopError(Exception):
    pass


async def _serve(queue: ActionQueue, body: Callable[[], Awaitable[None]]) -> None:
    """Run the queue's worker while ``body`` runs, then end it (it runs until cancelled)."""

    async def stop() -> None:
        await body()
        raise _StopError

    try:
        async with asyncio.TaskGroup() as tg:
            queue.start(tg, 1)
            tg.create_task(stop())
    except* _StopError:
        pass


async def _drained(queue: ActionQueue) -> None:
    for _ in range(400):
        if queue.pending == 0:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the queue did not drain")


def _spawn(bead: str, polecat: str) -> Spawn:
    return Spawn(
        bead=bead,
        session=f"{bead}-1",
        rig="demo",
        polecat=polecat,
        worktree=f"/w/{polecat}",
        branch=f"polecat/{polecat}/{bead}",
        tmux_name=f"gt-demo-{polecat}",
        attempt=1,
        agent="gt-agent",
    )


async def test_a_queued_key_is_queued_once_and_the_most_urgent_runs_first() -> None:
    runner = Runner()
    queue = ActionQueue(Witness(), runner)
    seen: dict[str, object] = {}

    async def body() -> None:
        queue.put(Clean(session="s-1", remove_worktree=True))
        queue.put(Clean(session="s-1", remove_worktree=False))  # the same key: already owed
        queue.put(_spawn("b-1", "nux"))
        queue.put(Kill(session="s-2"))
        seen.update(pending=queue.pending, busy=queue.busy(), reserved=queue.reserved())
        await _drained(queue)

    await _serve(queue, body)
    assert seen == {
        "pending": 3,
        "busy": {"session:s-1", "bead:b-1", "session:s-2"},
        "reserved": {("demo", "nux")},  # a spawn under way holds its polecat's name
    }
    assert runner.ran == ["session:s-2", "bead:b-1", "session:s-1"], "a kill, then a spawn, then a clean-up"
    assert (queue.done, queue.errors, queue.pending) == (3, 0, 0)
    assert queue.busy() == frozenset()
    assert queue.reserved() == frozenset()


@pytest.mark.parametrize(("failure", "errors"), [(RuntimeError, 1), (StartBlockedError, 0)])
async def test_a_failed_action_is_backed_off_its_key_busy_until_then(failure: type[Exception], errors: int) -> None:
    witness = Witness()
    runner = Runner(fail=failure)
    queue = ActionQueue(witness, runner)
    seen: dict[str, object] = {}

    async def body() -> None:
        queue.put(Kill(session="s-1"))
        await _drained(queue)
        queue.put(Kill(session="s-1"))  # the next plan owes it again at once
        seen.update(busy=queue.busy(), pending=queue.pending)

    await _serve(queue, body)
    assert seen == {"busy": {"session:s-1"}, "pending": 0}, "not queued again before its backoff ends"
    assert runner.ran == ["session:s-1"]
    assert (queue.done, queue.errors) == (0, errors), "a blocked start is no error"
    assert witness.wakes >= 1, "the next plan comes once the action is through"
