"""Queries the deacon answers (``gt.q.deacon.<name>``): service liveness, leases, automations, ``ci`` gate checks."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

import msgspec
from msgspec import UNSET, UnsetType

from shared.model import leases
from shared.model.queries.base import Query, R, Required, ServiceStatus


class DeaconQuery(Query[R], frozen=True, kw_only=True):
    """A query the deacon answers (``gt.q.deacon.<name>``)."""

    SERVICE: ClassVar[str] = "deacon"


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


class ServiceLiveness(msgspec.Struct, kw_only=True):
    """A service scope's liveness as the deacon last recorded it."""

    service: str
    status: str
    """up, down or stopped."""
    instance: str
    since: str
    reason: str


class RunView(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One run of an automation as the log has it (a field with nothing is left out of its JSON)."""

    id: str
    status: str
    gate: str
    reason: str
    action: str
    fired_at: str | None
    ended_at: str | None
    holder: str
    cursor: int | None = None
    lease_until: str | None = None
    exec: str | None = None
    formula: str | None = None
    rig: str | None = None
    bead: str | None = None
    result: str | None = None
    error: str | None = None
    exit_code: int | None = None


class AutomationView(msgspec.Struct, kw_only=True):
    """An automation: its file as read (the gate's and the action's fields, each left out when it does not apply),
    or why the file is not usable, and its runs as the log has them; ``history`` in ``automation`` only."""

    name: str
    status: str
    """idle, running, disabled, invalid, removed or "running (file removed)"."""
    file: str | UnsetType = UNSET
    description: str | UnsetType = UNSET
    enabled: bool | UnsetType = UNSET
    gate: str | UnsetType = UNSET
    action: str | UnsetType = UNSET
    interval_s: float | UnsetType = UNSET
    schedule: str | UnsetType = UNSET
    timezone: str | UnsetType = UNSET
    on: str | UnsetType = UNSET
    subject: str | UnsetType = UNSET
    check: str | UnsetType = UNSET
    check_timeout_s: float | UnsetType = UNSET
    exec: str | UnsetType = UNSET
    timeout_s: float | UnsetType = UNSET
    formula: str | UnsetType | None = UNSET
    rig: str | UnsetType | None = UNSET
    title: str | UnsetType = UNSET
    vars: dict[str, str] | UnsetType = UNSET
    next_due: str | UnsetType | None = UNSET
    waiting: str | UnsetType | None = UNSET
    """Why it is not due yet, in words (None: nothing holds it back)."""
    error: str | UnsetType = UNSET
    """Why its file is not usable (``invalid``)."""
    field: str | UnsetType = UNSET
    runs: int = 0
    completed: int = 0
    failed: int = 0
    last_fired_at: str | None = None
    cursor: int | UnsetType | None = UNSET
    open_run: RunView | None = None
    last_run: RunView | None = None
    history: list[RunView] | UnsetType = UNSET


class GateCheckView(msgspec.Struct, kw_only=True):
    """The last run of a waiting ``ci`` gate's check (``gt gate list`` shows it)."""

    bead: str
    step: str
    command: str
    started_at: datetime
    exit_code: int
    """``TIMEOUT_EXIT`` (124) when it ran out of time; -1: it could not start."""
    output: str = ""
    """The tail of its output (or why it could not start)."""
    runs: int = 1
    """How many times this deacon ran it."""


class GateChecks(DeaconQuery[list[GateCheckView]], frozen=True, kw_only=True):
    """The last run of each waiting ``ci`` gate's check by this deacon (since it started; its log has older ones)."""

    NAME: ClassVar[str] = "gate_checks"


class Services(DeaconQuery[list[ServiceLiveness]], frozen=True, kw_only=True):
    """Each service's liveness as the deacon last recorded it."""

    NAME: ClassVar[str] = "services"


class Leases(DeaconQuery[list[leases.Lease]], frozen=True, kw_only=True):
    NAME: ClassVar[str] = "leases"
    held: bool = False


class Lease(DeaconQuery[leases.LeaseView], frozen=True, kw_only=True):
    NAME: ClassVar[str] = "lease"
    name: Required


class Automations(DeaconQuery[list[AutomationView]], frozen=True, kw_only=True):
    NAME: ClassVar[str] = "automations"


class Automation(DeaconQuery[AutomationView], frozen=True, kw_only=True):
    NAME: ClassVar[str] = "automation"
    name: Required


QUERIES: tuple[type[Query[Any]], ...] = (Services, Leases, Lease, Automations, Automation, GateChecks)
"""What the deacon answers (besides ``status`` and ``digest``)."""
