"""What the deacon knows: service liveness, leases, the hooks of working beads, the last garbage collection sweep
and the disk alarm (automations add their own part, ``automations.state``). Plain data."""

from __future__ import annotations

from datetime import datetime

import msgspec

from services.deacon.automations.state import AutomationState
from shared.model.events.beads import BeadStatus
from shared.model.events.services import ServiceLiveness
from shared.model.gates import MoleculeGates
from shared.model.leases import Lease

DISK_ALARM_SOURCE = "deacon/disk"
"""The ``source`` of the disk alarm's escalations: how the fold finds its own among all escalations."""


class ServiceLife(msgspec.Struct, kw_only=True):
    name: str
    status: ServiceLiveness
    instance: str = ""
    since: datetime
    reason: str = ""
    version: int = 0


class LivenessState(msgspec.Struct, kw_only=True):
    services: dict[str, ServiceLife] = {}


class LeaseState(msgspec.Struct, kw_only=True):
    leases: dict[str, Lease] = {}
    """Every lease the log knows, by name (an ended one stays: its tokens go on counting)."""


class HookedBead(msgspec.Struct, kw_only=True, gc=False):
    id: str
    status: BeadStatus = "hooked"
    merge_pending: str | None = None
    """The merge request waiting in the queue (the hook is free while the refinery works on it)."""


class HookState(msgspec.Struct, kw_only=True):
    beads: dict[str, HookedBead] = {}
    """Slung beads not closed yet, by id."""
    by_lease: dict[str, str] = {}
    """Hook lease name -> its bead."""
    mr_beads: dict[str, str] = {}
    """Merge requests waiting in the queue -> their bead."""


class GcState(msgspec.Struct, kw_only=True):
    """The last sweep, as the log records it."""

    last_swept_at: datetime | None = None
    """When it was decided (its envelope's ``ts``)."""
    cutoff: datetime | None = None
    ttl_s: float = 0.0
    sweeps: int = 0
    version: int = 0
    """Stream sequence of the last ``gc.swept``: the expected sequence of the next one (0: none yet)."""


class DiskAlarmState(msgspec.Struct, kw_only=True):
    open: str | None = None
    """The open disk escalation's id."""
    raised: int = 0
    """Disk escalations raised so far: numbers the next one's command id, so a resend is carried out once."""


class DeaconState(msgspec.Struct, kw_only=True):
    liveness: LivenessState = msgspec.field(default_factory=LivenessState)
    leases: LeaseState = msgspec.field(default_factory=LeaseState)
    automations: AutomationState = msgspec.field(default_factory=AutomationState)
    gc: GcState = msgspec.field(default_factory=GcState)
    """The last garbage collection sweep."""
    hooks: HookState = msgspec.field(default_factory=HookState)
    """Slung beads not closed yet, for stale-hook detection."""
    disk: DiskAlarmState = msgspec.field(default_factory=DiskAlarmState)
    ci_gates: dict[str, MoleculeGates] = {}
    """The molecules with a ``ci`` gate, of beads not closed, by bead: whose checks the deacon runs
    (``plan/gates.py``)."""
    """The disk-space alarm's open escalation."""
