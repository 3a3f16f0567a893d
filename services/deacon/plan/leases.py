"""TTL leases: acquire, release (commands) and expiry (owed by the deacon). Pure.

The log holds acquisitions, releases and expiries; renewals live in the ``GT_LEASES`` KV bucket, so holders
renew as often as they like without growing the log. A held lease expires when neither its acquisition nor
its holder's newest renewal (for the same token) is younger than its TTL.
"""

from __future__ import annotations

import functools
from datetime import datetime, timedelta

import msgspec

from shared.commands import LeaseAcquire, LeaseRelease
from shared.decision import Accepted, NewEvent
from shared.errors import CommandError
from shared.events import Envelope, Event, LeaseAcquired, LeaseExpired, LeaseReleased
from shared.lease_rules import due_to_expire as due_to_expire
from shared.lease_rules import last_renewed as last_renewed
from shared.leases import Renewal


class Lease(msgspec.Struct, kw_only=True):
    name: str
    holder: str
    token: int
    ttl_s: float
    status: str
    """held, released or expired."""
    acquired_at: datetime
    ended_at: datetime | None = None
    """When it was released or expired."""
    version: int = 0


class LeaseState(msgspec.Struct, kw_only=True):
    leases: dict[str, Lease] = {}


@functools.singledispatch
def fold(payload: Event, state: LeaseState, env: Envelope, seq: int) -> None:
    """Other events change nothing here."""


@fold.register
def _acquired(payload: LeaseAcquired, state: LeaseState, env: Envelope, seq: int) -> None:
    state.leases[payload.lease] = Lease(
        name=payload.lease,
        holder=payload.holder,
        token=payload.token,
        ttl_s=payload.ttl_s,
        status="held",
        acquired_at=env.ts,
        version=seq,
    )


@fold.register
def _released(payload: LeaseReleased, state: LeaseState, env: Envelope, seq: int) -> None:
    if (lease := state.leases.get(payload.lease)) is not None and lease.token == payload.token:
        lease.status, lease.version, lease.ended_at = "released", seq, env.ts


@fold.register
def _expired(payload: LeaseExpired, state: LeaseState, env: Envelope, seq: int) -> None:
    if (lease := state.leases.get(payload.lease)) is not None and lease.token == payload.token:
        lease.status, lease.version, lease.ended_at = "expired", seq, env.ts


def view(lease: Lease) -> dict[str, object]:
    out: dict[str, object] = msgspec.to_builtins(lease)
    return out


def acquire(state: LeaseState, cmd: LeaseAcquire, now: datetime) -> Accepted:
    lease = state.leases.get(cmd.lease)
    if lease is not None and lease.status == "held":
        if lease.holder == cmd.holder:
            return Accepted(result={**view(lease), "changed": False})
        raise CommandError(
            "conflict",
            f"lease {cmd.lease} is held by {lease.holder} (token {lease.token}) until it is released or expires "
            f"(TTL {lease.ttl_s:g} s after its last renewal)",
        )
    token = lease.token + 1 if lease is not None else 1
    event = LeaseAcquired(
        lease=cmd.lease,
        holder=cmd.holder,
        token=token,
        ttl_s=cmd.ttl_s,
        expires_at=now + timedelta(seconds=cmd.ttl_s),
    )
    expected = lease.version if lease is not None else 0
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=expected)],
        result={"lease": cmd.lease, "holder": cmd.holder, "token": token, "ttl_s": cmd.ttl_s, "changed": True},
    )


def release(state: LeaseState, cmd: LeaseRelease) -> Accepted:
    lease = state.leases.get(cmd.lease)
    if lease is None:
        raise CommandError("not_found", f"no lease {cmd.lease!r}")
    if lease.token != cmd.token or lease.holder != cmd.holder:
        raise CommandError(
            "conflict", f"fenced: lease {cmd.lease} is at token {lease.token} of {lease.holder}, not {cmd.token}"
        )
    if lease.status == "released":
        return Accepted(result={**view(lease), "changed": False})
    if lease.status == "expired":
        raise CommandError("conflict", f"fenced: lease {cmd.lease} token {cmd.token} expired before the release")
    event = LeaseReleased(lease=cmd.lease, holder=cmd.holder, token=cmd.token)
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=lease.version)],
        result={"lease": cmd.lease, "token": cmd.token, "status": "released", "changed": True},
    )


def expiry(lease: Lease, renewal: Renewal | None) -> NewEvent:
    event = LeaseExpired(
        lease=lease.name, holder=lease.holder, token=lease.token, last_renewed=last_renewed(lease, renewal)
    )
    return NewEvent(payload=event, expected_seq=lease.version)
