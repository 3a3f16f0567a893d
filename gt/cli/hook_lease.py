"""The agent's side of its bead's hook lease: inside a session (``GT_LEASE`` and ``GT_LEASE_TOKEN`` set by the
witness) every command the CLI sends carries the lease as its ``fence``, and every ``gt`` call renews it.

A renewal that finds the lease lost does not stop the command: the service refuses a fenced command with the
reason (``fenced: ... expired``), which is what the agent should see.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime

import nats.errors
import structlog
from nats.aio.client import Client
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from shared import leases
from shared.bus.fencing import fence_error
from shared.commands import Fence
from shared.config import TownConfig

log = structlog.get_logger(__name__)


def session_bucket(js: JetStreamContext, bucket: str) -> KeyValue:
    """A KV bucket opened without asking for its stream's info: a polecat session may not (``STREAM.INFO`` of a
    bucket lists every key), only put and direct-get its own keys (shared/session_identity.py); the buckets
    answer direct gets (``topology.ensure_kv``)."""
    return KeyValue(name=bucket, stream=f"KV_{bucket}", pre=f"$KV.{bucket}.", js=js, direct=True)


def session_fence(env: Mapping[str, str] | None = None) -> Fence | None:
    """The hook lease of the session this process runs in (None outside a session, or a malformed token)."""
    env = os.environ if env is None else env
    lease, token = env.get("GT_LEASE"), env.get("GT_LEASE_TOKEN", "")
    if not lease or not token.isdigit():
        return None
    return Fence(lease=lease, token=int(token))


async def renew(nc: Client, config: TownConfig, fence: Fence, *, check_log: bool = False) -> str | None:
    """Renew the session's hook lease; None when renewed, else why it is lost.

    ``check_log`` also reads the lease's newest event first (the truth: a renewal entry may have been
    collected after a release, and a fresh one would then look renewed).
    """
    holder = os.environ.get("GT_SESSION", "")
    js = nc.jetstream()
    if check_log:
        fenced = await fence_error(js, config.evt_stream, fence)
        if fenced is not None:
            return fenced.message
    try:
        kv = session_bucket(js, config.lease_bucket)
        await leases.renew(kv, fence.lease, holder, fence.token, datetime.now(UTC))
    except leases.LeaseLostError as exc:
        return exc.why
    except (nats.errors.Error, TimeoutError) as exc:
        # Not renewed this time (NATS busy, bucket missing): the next `gt` call tries again; the TTL is long.
        log.warning("hook_lease_not_renewed", lease=fence.lease, error=repr(exc))
    return None
