"""Fencing: a command sent by a lease holder is carried out only while its token is the lease's live one.

Checked against the lease aggregate's newest event in the log (the truth, not a cache), so every service
fences the same way without tracking leases in its projection. A command that was checked just before the
lease expired was sent by the live holder: it counts.
"""

from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors
from nats.js.client import JetStreamContext

from shared.commands import Fence
from shared.errors import CommandError, GastownError
from shared.events import REGISTRY, LeaseAcquired, LeaseExpired, LeaseReleased, decode_envelope

READ_ATTEMPTS = 3


async def fence_error(js: JetStreamContext, stream: str, fence: Fence) -> CommandError | None:
    """None when ``fence.token`` holds ``fence.lease`` now; else the rejection that says why not."""
    subject = f"gt.evt.lease.{fence.lease}"
    for attempt in range(READ_ATTEMPTS):
        try:
            msg = await js.get_last_msg(stream, subject)
            break
        except nats.js.errors.NotFoundError:
            return CommandError("conflict", f"fenced: lease {fence.lease!r} was never acquired")
        except (nats.errors.Error, TimeoutError) as exc:
            if attempt == READ_ATTEMPTS - 1:
                return CommandError(
                    "conflict", f"could not read lease {fence.lease!r} to check the fence ({exc!r}); send it again"
                )
            await asyncio.sleep(0.1 * (attempt + 1))
    try:
        latest = REGISTRY.decode_payload(decode_envelope(msg.data or b""))
    except GastownError as exc:
        return CommandError("conflict", f"fenced: the newest event of lease {fence.lease} cannot be read: {exc}")
    if isinstance(latest, LeaseAcquired) and latest.token == fence.token:
        return None
    if isinstance(latest, LeaseAcquired):
        why = f"it is held with token {latest.token} by {latest.holder}"
    elif isinstance(latest, LeaseExpired) and latest.token == fence.token:
        why = f"it expired (last renewed {latest.last_renewed:%Y-%m-%d %H:%M:%S} UTC)"
    elif isinstance(latest, LeaseReleased) and latest.token == fence.token:
        why = "it was released"
    else:
        why = "it is not held with that token"
    return CommandError("conflict", f"fenced: token {fence.token} of lease {fence.lease} is not live: {why}")
