"""The witness's action queue: the plan's actions, most urgent first, carried out by a few workers.

An action whose key is queued or running is not queued again, so a slow action is never started a second time by
the next patrol; a failed one is retried by a later plan after a backoff (0.5 s doubling, at most
``MAX_RETRY_DELAY_S``), and until then its key counts as busy.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Protocol

import structlog

from services.witness.effects.toolkit import StartBlockedError
from services.witness.plan.actions import Action, Spawn
from shared.core.aio import raise_if_cancelling
from shared.core.errors import ActivityLostError

log = structlog.get_logger(__name__)

MAX_RETRY_DELAY_S = 30.0


class Runner(Protocol):
    async def run(self, action: Action) -> None: ...


class Host(Protocol):
    """What the workers need of the witness service."""

    async def wait_active(self) -> None: ...

    def wake(self) -> None: ...


class ActionQueue:
    def __init__(self, host: Host, runner: Runner) -> None:
        self.host = host
        self.runner = runner
        self._queue: asyncio.PriorityQueue[tuple[int, int, Action]] | None = None
        self._order = itertools.count()
        self._pending: dict[str, Action] = {}
        """Actions queued or running, by key."""
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self.done = 0
        self.errors = 0

    @property
    def started(self) -> bool:
        """Whether its workers run (from ``start``): before that nothing is queued."""
        return self._queue is not None

    @property
    def pending(self) -> int:
        return len(self._pending)

    def start(self, tg: asyncio.TaskGroup, workers: int) -> None:
        self._queue = asyncio.PriorityQueue()
        for n in range(workers):
            tg.create_task(self._worker(), name=f"witness-worker-{n}")

    def busy(self) -> frozenset[str]:
        """Keys of actions queued, running, or waiting out their backoff."""
        now = time.monotonic()
        return frozenset(self._pending) | {k for k, t in self._retry_at.items() if t > now}

    def reserved(self) -> frozenset[tuple[str, str]]:
        """(rig, polecat) names taken by spawns queued or running."""
        return frozenset((a.rig, a.polecat) for a in self._pending.values() if isinstance(a, Spawn))

    def put(self, action: Action) -> None:
        assert self._queue is not None
        if action.key in self._pending or self._retry_at.get(action.key, 0.0) > time.monotonic():
            return
        self._pending[action.key] = action
        self._queue.put_nowait((action.PRIORITY, next(self._order), action))

    async def _worker(self) -> None:
        assert self._queue is not None
        while True:
            raise_if_cancelling()  # an action's NATS call may have swallowed the cancel meant for this worker
            _, _, action = await self._queue.get()
            try:
                # An action touches tmux and git before it writes: never once standing down.
                await self.host.wait_active()
                await self.runner.run(action)
            except ActivityLostError:
                raise
            except StartBlockedError as exc:
                log.info("start_blocked", key=action.key, reason=str(exc))
                self._back_off(action.key, minimum=1.0)
            except Exception:
                # One failed action (git, tmux, NATS, a bug) must not stop the witness: it is logged with its
                # traceback and retried with backoff by the next plan. Cancellation is not caught.
                self.errors += 1
                log.exception("action_failed", action=type(action).__name__, key=action.key)
                self._back_off(action.key)
            else:
                self.done += 1
                self._failures.pop(action.key, None)
                self._retry_at.pop(action.key, None)
            finally:
                self._pending.pop(action.key, None)
                self.host.wake()

    def _back_off(self, key: str, minimum: float = 0.5) -> None:
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = min(MAX_RETRY_DELAY_S, max(minimum, 0.5 * 2 ** (failures - 1)))
        self._retry_at[key] = time.monotonic() + delay
        asyncio.get_running_loop().call_later(delay, self.host.wake)
