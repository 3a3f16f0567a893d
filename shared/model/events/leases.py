"""Events of the lease aggregate (``gt.evt.lease.<name>``), written by the deacon.

A lease is held by one holder at a time, for ``ttl_s`` seconds after its last renewal. Renewals go to the
``GT_LEASES`` KV bucket, not into the log (they would flood it); the log records acquisition, release and
expiry. ``token`` counts the acquisitions of the lease (1, 2, ...): a fencing token that tells a stale holder's
writes from the current one's.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from shared.model.events.base import Event


class LeaseEvent(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "lease"
    lease: str

    def aggregate_id(self) -> str:
        return self.lease


class LeaseAcquired(LeaseEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "lease.acquired"
    holder: str
    token: int
    ttl_s: float
    expires_at: datetime
    """Unless renewed before then."""


class LeaseReleased(LeaseEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "lease.released"
    holder: str
    token: int


class LeaseExpired(LeaseEvent, frozen=True, kw_only=True):
    """Its holder did not renew it in time: the holder is fenced out and the lease is free."""

    TYPE: ClassVar[str] = "lease.expired"
    holder: str
    token: int
    last_renewed: datetime


LEASE_EVENTS: tuple[type[Event], ...] = (LeaseAcquired, LeaseReleased, LeaseExpired)
