"""A lease as the log records it, and its state machine: the one record and the one fold every service keeps its
leases with, when a held lease has lapsed, and the events that move a lease. Pure: no I/O, no clock.

A lease (``gt.evt.lease.<name>``, events in ``shared.model.events.leases``) is held by one holder at a time, for
``ttl_s`` seconds after its last renewal. The log records acquisition, release and expiry; renewals go to the
``GT_LEASES`` KV bucket (read and written by ``shared.bus.lease_kv``), so a ``Renewal`` comes into these functions as
data. Each service folds the leases it cares about into a ``dict[str, Lease]`` of its own state with
``fold_lease``: the deacon all of them (it decides acquisitions and releases and expires them), the refinery its
rigs' merge leases and the hook leases of the beads it may merge for, the witness its sessions' hook leases.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final, Literal

import msgspec

from shared.model.decision import NewEvent
from shared.model.events import Envelope, LeaseAcquired, LeaseEvent, LeaseExpired, LeaseReleased
from shared.model.fold import touch

LeaseStatus = Literal["held", "released", "expired"]
HELD: Final = "held"
RELEASED: Final = "released"
EXPIRED: Final = "expired"


class Renewal(msgspec.Struct, frozen=True, kw_only=True):
    """A lease's entry in the ``GT_LEASES`` bucket: its holder's newest renewal."""

    holder: str
    token: int
    renewed_at: datetime
    expired: bool = False
    """Set by the deacon when it expires the lease: no renewal of this token is taken after it."""


class Lease(msgspec.Struct, kw_only=True, gc=False):
    """A lease as its newest acquisition left it, and how that acquisition ended."""

    name: str
    holder: str
    """Who holds it, or held it last: a session (hook leases), a refinery (merge leases), any holder that asked
    the deacon."""
    token: int
    """Its acquisitions so far (1, 2, ...): the fencing token of the holder, refused once it is not the newest."""
    ttl_s: float
    status: LeaseStatus = HELD
    """held, released or expired."""
    acquired_at: datetime
    ended_at: datetime | None = None
    """When it was released or expired."""
    version: int = 0
    """Stream sequence of the lease's last event: the expected sequence of its next one."""

    def held_by(self, holder: str, token: int | None = None) -> bool:
        """Held now by ``holder`` (with ``token``, when given)."""
        return self.status == HELD and self.holder == holder and (token is None or self.token == token)


class LeaseView(Lease, kw_only=True, gc=False):
    """A lease as ``gt.q.deacon.lease`` answers it: the record, and when it was last renewed."""

    last_renewed: str
    """ISO 8601: the newest renewal the deacon saw, or its acquisition."""


def fold_lease(payload: LeaseEvent, leases: dict[str, Lease], env: Envelope, seq: int) -> None:
    """Fold a lease event stored at ``seq`` into ``leases``. An acquisition replaces the record (a new holder, the
    next token); a release or an expiry ends the lease only while it is held with the token it names; every
    event on the lease moves its version."""
    if isinstance(payload, LeaseAcquired):
        leases[payload.lease] = Lease(
            name=payload.lease,
            holder=payload.holder,
            token=payload.token,
            ttl_s=payload.ttl_s,
            acquired_at=env.ts,
            version=seq,
        )
    elif (
        (lease := touch(leases, payload.lease, seq)) is not None
        and isinstance(payload, LeaseReleased | LeaseExpired)
        and lease.token == payload.token
        and lease.status == HELD
    ):
        lease.status = RELEASED if isinstance(payload, LeaseReleased) else EXPIRED
        lease.ended_at = env.ts


def last_renewed(lease: Lease, renewal: Renewal | None) -> datetime:
    """Its holder's newest renewal of this acquisition, or the acquisition itself."""
    if renewal is not None and renewal.token == lease.token and renewal.holder == lease.holder:
        return max(renewal.renewed_at, lease.acquired_at)
    return lease.acquired_at


def due_to_expire(lease: Lease, renewal: Renewal | None, now: datetime) -> bool:
    """Held, and not renewed within its TTL (or already marked expired in the bucket by a deacon that then
    crashed before recording it)."""
    if lease.status != HELD:
        return False
    if renewal is not None and renewal.token == lease.token and renewal.expired:
        return True
    return (now - last_renewed(lease, renewal)).total_seconds() > lease.ttl_s


def acquisition(lease: Lease | None, name: str, holder: str, ttl_s: float, now: datetime) -> tuple[NewEvent, int]:
    """The event that gives lease ``name`` (its record ``lease``, None: never acquired) to ``holder`` with the
    next token, expecting the lease's last event; and that token."""
    token = lease.token + 1 if lease is not None else 1
    event = LeaseAcquired(
        lease=name, holder=holder, token=token, ttl_s=ttl_s, expires_at=now + timedelta(seconds=ttl_s)
    )
    return NewEvent(payload=event, expected_seq=lease.version if lease is not None else 0), token


def release(lease: Lease) -> NewEvent:
    """The event by which the holder gives ``lease`` back, expecting its last event."""
    event = LeaseReleased(lease=lease.name, holder=lease.holder, token=lease.token)
    return NewEvent(payload=event, expected_seq=lease.version)


def expiry(lease: Lease, renewal: Renewal | None) -> NewEvent:
    """The event by which the deacon ends ``lease`` its holder did not renew in time."""
    event = LeaseExpired(
        lease=lease.name, holder=lease.holder, token=lease.token, last_renewed=last_renewed(lease, renewal)
    )
    return NewEvent(payload=event, expected_seq=lease.version)
