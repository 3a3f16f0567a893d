"""Idempotence marks in the ``GT_PLUGINS`` KV bucket: what makes at-least-once delivery act exactly once.

One key per plugin and event, ``<plugin>.<event id>``, moves ``begun`` -> ``done``:

1. before the side effect, ``begun`` is created (create-if-absent, so only one attempt ever creates it);
2. the side effect runs;
3. ``done`` is recorded;
4. the handler returns; the SDK records the plugin's position (``<plugin>.position.last``) after the batch.

A process killed after 3 gets the event again (its position was not recorded past it) and is told it was
done. One killed between 1 and 3 is told the earlier attempt was *interrupted*: the side effect may or may not have
happened, and only the plugin can check which (is the line in the file, is the ticket there). A side
effect that is idempotent, or checked when interrupted, therefore happens exactly once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import NamedTuple, TypeVar

import structlog

from shared.bus import log_read
from shared.bus.connection import Connection
from shared.bus.kv import Bucket
from shared.core import ids
from shared.core.aio import pause, raise_if_cancelling
from shared.core.errors import retryable
from shared.core.faults import crash_point
from shared.plugins.position import encode_position, parse_position
from shared.plugins.settings import position_key

log = structlog.get_logger(__name__)

BEGUN = b"begun"
DONE = b"done"
KV_RETRY_DEADLINE_S = 30.0
T = TypeVar("T")


class Claim(NamedTuple):
    """What ``once`` found for an event."""

    first: bool
    """No earlier attempt finished: do the side effect (False: it is done, skip it)."""
    interrupted: bool
    """An earlier attempt began and did not record completion (it died or raised mid-way): the side
    effect may already have happened; check before repeating one that is not idempotent."""


def mark_key(plugin: str, event_id: str) -> str:
    """``<plugin>.<event id>``; an id that is not a valid token (a foreign writer's) becomes a stable digest."""
    token = event_id if ids.is_valid_id(event_id) else ids.stable_digest_id(event_id, prefix="evt")
    return f"{plugin}.{token}"


def dead_key(plugin: str, seq: int) -> str:
    """Where an abandoned event is recorded; three tokens, so it never collides with a mark."""
    return f"{plugin}.dead.{seq}"


async def retrying(what: str, op: Callable[[], Awaitable[T]]) -> T:
    """Retry ``op`` through short NATS outages; past the deadline the error reaches the caller (inside a
    handler: a failed attempt, so the event is redelivered later)."""
    give_up_at = time.monotonic() + KV_RETRY_DEADLINE_S
    attempt = 0
    while True:
        raise_if_cancelling()
        try:
            return await op()
        except Exception as exc:
            if not retryable(exc):
                raise
            attempt += 1
            if time.monotonic() >= give_up_at:
                raise
            log.warning("plugin_nats_retry", op=what, attempt=attempt, error=repr(exc))
            await pause(min(1.0, 0.05 * 2 ** min(attempt, 5)))


class Marks:
    """One plugin's marks and position, in the bucket the services made (``topology.provision``). Read by key with
    direct gets only: the plugins' account may neither ask for the bucket's stream info nor watch it."""

    def __init__(self, nc: Connection, bucket: str, plugin: str) -> None:
        self._nc = nc
        self._bucket = bucket
        self._kv = Bucket(nc, bucket, keys_only=True)
        self._plugin = plugin

    async def state(self, event_id: str) -> bytes | None:
        """``begun``, ``done`` or None (never marked, or expired)."""
        key = mark_key(self._plugin, event_id)

        async def get() -> bytes | None:
            entry = await self._kv.get(key)
            return entry.value if entry is not None else None

        return await retrying("get", get)

    async def seen(self, event_id: str) -> bool:
        """True when a side effect for this event was recorded as done."""
        return await self.state(event_id) == DONE

    async def mark_done(self, event_id: str) -> None:
        """Record the event as done without the begun step (for side effects that are their own record)."""
        key = mark_key(self._plugin, event_id)
        await retrying("put", lambda: self._kv.put(key, DONE))

    @contextlib.asynccontextmanager
    async def once(self, event_id: str) -> AsyncIterator[Claim]:
        """Bracket one side effect; see the module docstring. The block always runs: test ``claim.first``.

        Leaving the block normally records ``done``; an exception leaves ``begun``, so the next attempt is
        told it was interrupted.
        """
        key = mark_key(self._plugin, event_id)

        async def begin() -> bytes | None:
            if await self._kv.create(key, BEGUN):
                return None
            entry = await self._kv.get(key)
            # None: expired between the two calls: treat it as interrupted, the safe side.
            return entry.value if entry is not None else BEGUN

        found = await retrying("create", begin)
        if found == DONE:
            yield Claim(first=False, interrupted=False)
            return
        crash_point("plugin_mark_begun")
        yield Claim(first=True, interrupted=found is not None)
        crash_point("plugin_side_effect_done")
        await retrying("put", lambda: self._kv.put(key, DONE))

    async def record_dead(self, seq: int, body: bytes) -> None:
        await retrying("put", lambda: self._kv.put(dead_key(self._plugin, seq), body))

    async def purge(self) -> None:
        """Forget every mark of this plugin, its position included (a replay from the start acts on every event
        again)."""
        await retrying("purge", lambda: self._kv.purge_keys(self._plugin))
        log.info("plugin_marks_purged", plugin=self._plugin)

    async def position(self) -> int | None:
        """The last sequence the plugin recorded as done with; None when it recorded none (or the bucket is not
        there: raises ``nats.errors.NoRespondersError`` then, like any NATS failure, after no retry)."""
        entry = await self._kv.get(position_key(self._plugin))
        return parse_position(entry.value) if entry is not None else None

    async def record_position(self, seq: int) -> None:
        """Record ``seq`` as the last sequence the plugin is done with. Kept whatever the bucket's TTL: a plugin
        stopped for longer still resumes where it stood."""
        value = encode_position(seq)
        await retrying("position", lambda: log_read.put_kept(self._nc, self._bucket, position_key(self._plugin), value))
