"""Queries the deacon answers (``gt.q.deacon.<name>``): service liveness, leases, automations."""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from shared.model.queries.base import Query, Required, ServiceStatus


class DeaconStatus(ServiceStatus, kw_only=True):
    """The deacon's ``status``: services' liveness and leases as it records them, its watch and GC, and its
    automations."""

    services: dict[str, str] = {}
    """Service scope -> up, down or stopped."""
    leases_held: int = 0
    leases_expired: int = 0
    watch_errors: int = 0
    stale_hooks_handed_over: int = 0
    gc_last_swept_at: str | None = None
    gc_cutoff: str | None = None
    gc_sweeps: int = 0
    gc_kv_purged: dict[str, int] = {}
    """KV entries of dead things purged: leases, heartbeats, services."""
    automations: int = 0
    automations_invalid: list[str] = []
    automation_runs_open: list[str] = []
    automations_fired: int = 0
    automations_completed: int = 0
    automations_failed: int = 0
    automation_checks_run: int = 0
    automation_scan_errors: int = 0


class _DeaconQuery(Query[Any], frozen=True, kw_only=True):
    SERVICE: ClassVar[str] = "deacon"


class ServiceLiveness(msgspec.Struct, kw_only=True):
    """A service scope's liveness as the deacon last recorded it."""

    service: str
    status: str
    """up, down or stopped."""
    instance: str
    since: str
    reason: str


class Services(_DeaconQuery, frozen=True, kw_only=True):
    """Each service's liveness as the deacon last recorded it."""

    NAME: ClassVar[str] = "services"


class Leases(_DeaconQuery, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "leases"
    held: bool = False


class Lease(_DeaconQuery, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "lease"
    name: Required


class Automations(_DeaconQuery, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "automations"


class Automation(_DeaconQuery, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "automation"
    name: Required


QUERIES: tuple[type[Query[Any]], ...] = (Services, Leases, Lease, Automations, Automation)
"""What the deacon answers (besides ``status`` and ``digest``)."""
