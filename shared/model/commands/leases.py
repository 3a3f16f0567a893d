"""Lease commands (owner: deacon). Renewals are not commands: holders renew in the ``GT_LEASES`` KV bucket."""

from __future__ import annotations

from typing import ClassVar

from shared.core.ids import RESERVED_LEASE_PREFIXES
from shared.model.commands.base import Command, check_text, invalid
from shared.model.results import LeaseResult

MAX_TTL_S = 7 * 24 * 3600.0


class LeaseAcquire(Command[LeaseResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Hold ``lease`` for ``ttl_s`` seconds after each renewal; refused while another holder's lease lives."""

    SUBJECT: ClassVar[str] = "gt.cmd.lease.acquire"
    OWNER: ClassVar[str] = "deacon"
    ORDERED_BY = ("lease", "lease")
    REQUIRED_IDS = ("lease",)
    lease: str
    holder: str
    ttl_s: float

    def validate(self) -> None:
        super().validate()
        if self.lease.startswith(RESERVED_LEASE_PREFIXES):
            raise invalid(
                f"`lease` {self.lease!r} starts with a prefix the services keep for themselves "
                f"({', '.join(RESERVED_LEASE_PREFIXES)}): pick another name"
            )
        check_text("holder", self.holder, 200, nonblank=True)
        if not 0.1 <= self.ttl_s <= MAX_TTL_S:
            raise invalid(f"`ttl_s` must be between 0.1 and {MAX_TTL_S:g} seconds, got {self.ttl_s:g}")


class LeaseRelease(Command[LeaseResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Give the lease up; only its current holder, with the current token, can."""

    SUBJECT: ClassVar[str] = "gt.cmd.lease.release"
    OWNER: ClassVar[str] = "deacon"
    ORDERED_BY = ("lease", "lease")
    REQUIRED_IDS = ("lease",)
    lease: str
    holder: str
    token: int

    def validate(self) -> None:
        super().validate()
        check_text("holder", self.holder, 200, nonblank=True)


LEASE_COMMANDS: tuple[type[Command], ...] = (LeaseAcquire, LeaseRelease)
