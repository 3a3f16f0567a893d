"""Fencing: a command sent by a lease holder is carried out only if its token was the lease's live one when the
command was stored.

Checked against the lease aggregate's events in the log (the truth, not a cache), so every service fences the
same way without tracking leases in its projection. A command stored in GT_CMD while its sender held the lease
counts even when it is processed later (its service was down meanwhile); one stored after the token ended is
refused. The two times compared are the command's storage time (the NATS server's clock) and the ending
event's time (the writing service's clock): on one machine they agree; across machines, keep clocks in sync.
"""

from __future__ import annotations

from datetime import datetime

import nats.errors
import nats.js.errors
from nats.js.client import JetStreamContext

from shared.bus.connection import Connection
from shared.bus.errors import map_errors
from shared.core import subjects
from shared.core.aio import pause
from shared.core.errors import CommandError, GastownError
from shared.model.commands import Fence
from shared.model.events import REGISTRY, LeaseAcquired, LeaseExpired, LeaseReleased, decode_envelope
from shared.model.events.base import Envelope

READ_ATTEMPTS = 3


@map_errors
async def fence_error(
    nc: Connection,
    stream: str,
    fence: Fence,
    *,
    stored_at: datetime | None = None,
    holder: str | None = None,
) -> CommandError | None:
    """None when ``fence.token`` holds ``fence.lease`` now (or held it at ``stored_at``, when given); else the
    rejection that says why not. With ``holder`` (the session a command came from), the token must also be that
    holder's: a session cannot borrow another's fence by guessing its token."""
    js = nc.jetstream()
    subject = subjects.event_subject("lease", fence.lease)
    for attempt in range(READ_ATTEMPTS):
        try:
            # A direct get names the subject in its own (a polecat session may read its own lease's only).
            msg = await js.get_last_msg(stream, subject, direct=True)
            break
        except nats.js.errors.NotFoundError:
            return CommandError("conflict", f"fenced: lease {fence.lease!r} was never acquired")
        except (nats.errors.Error, TimeoutError) as exc:
            if attempt == READ_ATTEMPTS - 1:
                return CommandError(
                    "conflict", f"could not read lease {fence.lease!r} to check the fence ({exc!r}); send it again"
                )
            await pause(0.1 * (attempt + 1))
    try:
        latest = REGISTRY.decode_payload(decode_envelope(msg.data or b""))
    except GastownError as exc:
        return CommandError("conflict", f"fenced: the newest event of lease {fence.lease} cannot be read: {exc}")
    if isinstance(latest, LeaseAcquired) and latest.token == fence.token:
        return _not_held_by(fence, latest.holder, holder)
    if stored_at is not None:
        ended, held_by = await _token_ended_at(js, stream, subject, fence.token)
        if ended is not None and ended > stored_at:
            return _not_held_by(fence, held_by, holder)  # stored while the token was live
    if isinstance(latest, LeaseAcquired):
        why = f"it is held with token {latest.token} by {latest.holder}"
    elif isinstance(latest, LeaseExpired) and latest.token == fence.token:
        why = f"it expired (last renewed {latest.last_renewed:%Y-%m-%d %H:%M:%S} UTC)"
    elif isinstance(latest, LeaseReleased) and latest.token == fence.token:
        why = "it was released"
    elif isinstance(latest, LeaseReleased | LeaseExpired):
        how = "released" if isinstance(latest, LeaseReleased) else "expired"
        why = f"it passed on: token {latest.token} of {latest.holder} has since {how}"
    else:
        why = "it is not held with that token"
    return CommandError("conflict", f"fenced: token {fence.token} of lease {fence.lease} is not live: {why}")


def _not_held_by(fence: Fence, token_holder: str | None, sender: str | None) -> CommandError | None:
    if sender is None or token_holder == sender:
        return None
    return CommandError(
        "unauthorized", f"fenced: token {fence.token} of lease {fence.lease} is not held by session {sender}"
    )


async def _token_ended_at(
    js: JetStreamContext, stream: str, subject: str, token: int
) -> tuple[datetime | None, str | None]:
    """When ``token`` stopped holding the lease (its release or expiry, or the next acquisition), and who held
    it, from the lease's history; (None, ...) if it never held it or the history cannot be read."""
    seq, held, held_by = 0, False, None
    while True:
        try:
            msg = await js.get_msg(stream, seq=seq + 1, subject=subject, next=True)
        except nats.js.errors.NotFoundError:
            return None, held_by
        except (nats.errors.Error, TimeoutError):
            return None, held_by
        seq = int(msg.seq or 0)
        try:
            env: Envelope = decode_envelope(msg.data or b"")
            event = REGISTRY.decode_payload(env)
        except GastownError:
            continue
        if isinstance(event, LeaseAcquired):
            if held and event.token != token:
                return env.ts, held_by
            if event.token == token:
                held, held_by = True, event.holder
        elif isinstance(event, LeaseReleased | LeaseExpired) and event.token == token and held:
            return env.ts, held_by
