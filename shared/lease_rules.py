"""When a held lease has lapsed: its acquisition and its holder's newest renewal (same token) are both older than
its TTL. Pure; shared by the deacon (which expires leases) and the services that take a lapsed lease over."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from shared.leases import Renewal


class HeldLease(Protocol):
    @property
    def holder(self) -> str: ...
    @property
    def token(self) -> int: ...
    @property
    def ttl_s(self) -> float: ...
    @property
    def status(self) -> str: ...
    @property
    def acquired_at(self) -> datetime: ...


def last_renewed(lease: HeldLease, renewal: Renewal | None) -> datetime:
    if renewal is not None and renewal.token == lease.token and renewal.holder == lease.holder:
        return max(renewal.renewed_at, lease.acquired_at)
    return lease.acquired_at


def due_to_expire(lease: HeldLease, renewal: Renewal | None, now: datetime) -> bool:
    """Held, and not renewed within its TTL (or already marked expired in the bucket by a deacon that then
    crashed before recording it)."""
    if lease.status != "held":
        return False
    if renewal is not None and renewal.token == lease.token and renewal.expired:
        return True
    return (now - last_renewed(lease, renewal)).total_seconds() > lease.ttl_s


class EndableLease(Protocol):
    token: int
    status: str
    version: int


def record_end(lease: EndableLease | None, token: int, status: str, seq: int) -> None:
    """Fold a release or expiry (``status``) of ``token`` stored at ``seq`` into a projection's copy of the lease:
    any event on the lease's subject moves its version; only its current token can end it."""
    if lease is None:
        return
    lease.version = seq
    if lease.token == token and lease.status == "held":
        lease.status = status
