"""The agent's side of its bead's hook lease: inside a session (``GT_LEASE`` and ``GT_LEASE_TOKEN`` set by the
witness) every command the CLI sends carries the lease as its ``fence``, and every ``gt`` call renews it.

A renewal that finds the lease lost does not stop the command: the service refuses a fenced command with the
reason (``fenced: ... expired``), which is what the agent should see.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

import structlog

from shared.bus import lease_kv as leases
from shared.bus.errors import BusError
from shared.bus.fencing import fence_error
from shared.bus.kv import Bucket, put_agent_heartbeat
from shared.core.aio import pause
from shared.core.config import TownConfig
from shared.model import heartbeats
from shared.model.commands import Fence

if TYPE_CHECKING:
    from shared.bus.connection import Connection

log = structlog.get_logger(__name__)

T = TypeVar("T")

KEEP_ALIVE_EVERY_S = 3.0
"""How often a session's long `gt` call renews its heartbeat and hook lease: a quarter of the shortest stall limit
and lease TTL a rig is run with (the chaos run's 12 s)."""


def session_fence(env: Mapping[str, str] | None = None) -> Fence | None:
    """The hook lease of the session this process runs in (None outside a session, or a malformed token)."""
    env = os.environ if env is None else env
    lease, token = env.get("GT_LEASE"), env.get("GT_LEASE_TOKEN", "")
    if not lease or not token.isdigit():
        return None
    return Fence(lease=lease, token=int(token))


async def renew(nc: Connection, config: TownConfig, fence: Fence, *, check_log: bool = False) -> str | None:
    """Renew the session's hook lease; None when renewed, else why it is lost.

    ``check_log`` also reads the lease's newest event first (the truth: a renewal entry may have been
    collected after a release, and a fresh one would then look renewed).
    """
    holder = os.environ.get("GT_SESSION", "")
    if check_log:
        fenced = await fence_error(nc, config.evt_stream, fence)
        if fenced is not None:
            return fenced.message
    try:
        # Opened as a session may (only its own keys): ``Bucket``'s ``keys_only``.
        kv = Bucket(nc, config.lease_bucket, keys_only=True)
        await leases.renew(kv, fence.lease, holder, fence.token, datetime.now(UTC))
    except leases.LeaseLostError as exc:
        return exc.why
    except (BusError, TimeoutError) as exc:
        # Not renewed this time (NATS busy, bucket missing): the next `gt` call tries again; the TTL is long.
        log.warning("hook_lease_not_renewed", lease=fence.lease, error=repr(exc))
    return None


async def kept_alive(nc: Connection, config: TownConfig, work: Awaitable[T]) -> T:
    """``work``, one `gt` call of a polecat session, with the session's heartbeat and hook lease renewed every
    ``KEEP_ALIVE_EVERY_S`` while it runs.

    A call that waits out a town restart (``GT_TOWN_PATIENCE``, gt/cli/patience.py) or a command's answer is its
    agent alive and waiting, not stalled: both records live in NATS's KV, which answers while a service restarts.
    Without this the witness warranted such a session as stalled, and the chaos run (services killed every few
    seconds) spent most of its sessions so. The wait itself is bounded by the patience, so a hung call does not
    keep a session alive for ever."""
    beats = asyncio.create_task(_beat_while_running(nc, config))
    try:
        return await work
    finally:
        beats.cancel()
        await asyncio.wait([beats])  # it ends: each round starts with ``pause``, which raises a swallowed cancel


async def _beat_while_running(nc: Connection, config: TownConfig) -> None:
    session = os.environ.get("GT_SESSION", "")
    started = time.monotonic()
    while True:
        # ``pause``, not ``asyncio.sleep``: a cancel that lands in a round's NATS call can be swallowed there (nats-py
        # does), and this loop then beat for ever after its call ended, keeping a finished call's process and its
        # session alive (found by the 1,000-bead chaos run: a session "working" for over half an hour, its `gt prime`
        # answered long before).
        await pause(KEEP_ALIVE_EVERY_S)
        note = f"a gt call waiting for {time.monotonic() - started:.0f} s (the town or an answer)"
        try:
            beat = heartbeats.agent_heartbeat(session, note, datetime.now(UTC))
            await put_agent_heartbeat(nc, config, session, heartbeats.encode_agent(beat))
        except (BusError, TimeoutError) as exc:
            log.warning("session_heartbeat_not_written", session=session, error=repr(exc))
        fence = session_fence()
        if fence is not None:
            await renew(nc, config, fence)
