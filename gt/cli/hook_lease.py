"""The agent's side of its bead's hook lease: inside a session (``GT_LEASE`` and ``GT_LEASE_TOKEN`` set by the
witness) every command the CLI sends carries the lease as its ``fence``, and every ``gt`` call renews it.

A renewal that finds the lease lost does not stop the command: the service refuses a fenced command with the
reason (``fenced: ... expired``), which is what the agent should see.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import structlog

from shared.bus import lease_kv as leases
from shared.bus.errors import BusError
from shared.bus.fencing import fence_error
from shared.bus.kv import Bucket
from shared.core.config import TownConfig
from shared.model.commands import Fence

if TYPE_CHECKING:
    from shared.bus.connection import Connection

log = structlog.get_logger(__name__)


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
