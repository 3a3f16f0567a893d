"""What the deacon knows: service liveness and leases (automations add their own part). Plain data."""

from __future__ import annotations

import msgspec

from services.deacon.automations.state import AutomationState
from services.deacon.plan.disk import DiskAlarmState
from services.deacon.plan.gc import GcState
from services.deacon.plan.hooks import HookState
from services.deacon.plan.leases import LeaseState
from services.deacon.plan.liveness import LivenessState


class DeaconState(msgspec.Struct, kw_only=True):
    liveness: LivenessState = msgspec.field(default_factory=LivenessState)
    leases: LeaseState = msgspec.field(default_factory=LeaseState)
    automations: AutomationState = msgspec.field(default_factory=AutomationState)
    gc: GcState = msgspec.field(default_factory=GcState)
    hooks: HookState = msgspec.field(default_factory=HookState)
    """Slung beads not closed yet, for stale-hook detection."""
    disk: DiskAlarmState = msgspec.field(default_factory=DiskAlarmState)
    """The disk-space alarm's open escalation."""
    """The last garbage collection sweep."""
