"""An escalation as the mayor keeps it and shows it: one class is the record of its projection and the answer of
``gt.q.mayor.escalations``. Pure data."""

from __future__ import annotations

from datetime import datetime

import msgspec

from shared.model.events.escalations import EscalationStatus


class Escalation(msgspec.Struct, kw_only=True, gc=False):
    id: str
    severity: str
    original_severity: str
    source: str
    message: str
    bead: str | None = None
    status: EscalationStatus = "open"
    """open -> acked -> closed (or open -> closed)."""
    raised_at: datetime
    last_raised_at: datetime
    """When it was raised, or last re-escalated: re-escalation counts from here."""
    reescalations: int = 0
    acked_at: datetime | None = None
    acked_by: str | None = None
    closed_at: datetime | None = None
    closed_by: str | None = None
    close_reason: str | None = None
    resolved_when: list[str] = []
    """What resolves it by itself (``bead:<id>``, ``mr:<id>``, ``rig:<name>``, ``service:<name>``): then the mayor
    closes it. Empty: only a person does."""
    resolved: str | None = None
    """What resolved it, seen in an event after it was raised (a merge, a session done on its rig): the reason the
    mayor closes it with. Beads and services are read from the state instead (``plan.resolutions``)."""
    version: int = 0
