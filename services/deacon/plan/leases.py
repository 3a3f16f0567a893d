"""TTL leases: acquire and release (commands) and expiry (owed by the deacon), decided on the record of every
lease (``shared.lease_state``: the record, its fold and the events that move it). Pure.

The log holds acquisitions, releases and expiries; renewals live in the ``GT_LEASES`` KV bucket, so holders
renew as often as they like without growing the log. A held lease expires when neither its acquisition nor
its holder's newest renewal (for the same token) is younger than its TTL (``lease_state.due_to_expire``).
"""

from __future__ import annotations

import functools
from datetime import datetime

import msgspec

from shared.commands import LeaseAcquire, LeaseRelease
from shared.decision import Accepted
from shared.errors import CommandError
from shared.events import Envelope, Event, LeaseEvent
from shared.lease_state import Lease, acquisition, fold_lease
from shared.lease_state import release as release_event
from shared.results import LeaseResult


class LeaseState(msgspec.Struct, kw_only=True):
    leases: dict[str, Lease] = {}
    """Every lease the log knows, by name (an ended one stays: its tokens go on counting)."""


@functools.singledispatch
def fold(payload: Event, state: LeaseState, env: Envelope, seq: int) -> None:
    """Other events change nothing here."""


@fold.register
def _lease(payload: LeaseEvent, state: LeaseState, env: Envelope, seq: int) -> None:
    fold_lease(payload, state.leases, env, seq)


def view(lease: Lease) -> dict[str, object]:
    out: dict[str, object] = msgspec.to_builtins(lease)
    return out


def unchanged(lease: Lease) -> LeaseResult:
    """Asked again of what is already so: the lease's whole record."""
    return msgspec.convert({**view(lease), "changed": False}, LeaseResult)


def acquire(state: LeaseState, cmd: LeaseAcquire, now: datetime) -> Accepted[LeaseResult]:
    lease = state.leases.get(cmd.lease)
    if lease is not None and lease.status == "held":
        if lease.holder == cmd.holder:
            return Accepted(result=unchanged(lease))
        raise CommandError(
            "conflict",
            f"lease {cmd.lease} is held by {lease.holder} (token {lease.token}) until it is released or expires "
            f"(TTL {lease.ttl_s:g} s after its last renewal)",
        )
    event, token = acquisition(lease, cmd.lease, cmd.holder, cmd.ttl_s, now)
    return Accepted(
        events=[event],
        result=LeaseResult(lease=cmd.lease, holder=cmd.holder, token=token, ttl_s=cmd.ttl_s, changed=True),
    )


def release(state: LeaseState, cmd: LeaseRelease) -> Accepted[LeaseResult]:
    lease = state.leases.get(cmd.lease)
    if lease is None:
        raise CommandError("not_found", f"no lease {cmd.lease!r}")
    if lease.token != cmd.token or lease.holder != cmd.holder:
        raise CommandError(
            "conflict", f"fenced: lease {cmd.lease} is at token {lease.token} of {lease.holder}, not {cmd.token}"
        )
    if lease.status == "released":
        return Accepted(result=unchanged(lease))
    if lease.status == "expired":
        raise CommandError("conflict", f"fenced: lease {cmd.lease} token {cmd.token} expired before the release")
    return Accepted(
        events=[release_event(lease)],
        result=LeaseResult(lease=cmd.lease, token=cmd.token, status="released", changed=True),
    )
