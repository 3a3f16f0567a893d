"""Queries the deacon answers (``gt.q.deacon.<name>``): service liveness, leases, automations."""

from __future__ import annotations

from typing import Any, ClassVar

from shared.queries.base import Query


class _DeaconQuery(Query[Any], frozen=True, kw_only=True, forbid_unknown_fields=True):
    SERVICE: ClassVar[str] = "deacon"


class Services(_DeaconQuery, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Each service's liveness as the deacon last recorded it."""

    NAME: ClassVar[str] = "services"


class Leases(_DeaconQuery, frozen=True, kw_only=True, forbid_unknown_fields=True):
    NAME: ClassVar[str] = "leases"
    held: bool = False


class Lease(_DeaconQuery, frozen=True, kw_only=True, forbid_unknown_fields=True):
    NAME: ClassVar[str] = "lease"
    name: str


class Automations(_DeaconQuery, frozen=True, kw_only=True, forbid_unknown_fields=True):
    NAME: ClassVar[str] = "automations"


class Automation(_DeaconQuery, frozen=True, kw_only=True, forbid_unknown_fields=True):
    NAME: ClassVar[str] = "automation"
    name: str
