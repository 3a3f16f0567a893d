"""Events of the escalation aggregate (``gt.evt.escalation.<id>``): problems put before the operator."""

from __future__ import annotations

from typing import ClassVar, Literal

from shared.model.events.base import Event

EscalationStatus = Literal["open", "acked", "closed"]
"""Raised open, acked by an operator (re-escalation stops), closed (by an operator, or once what it waits for is
done)."""


class EscalationEvent(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "escalation"
    escalation_id: str

    def aggregate_id(self) -> str:
        return self.escalation_id


class EscalationRaised(EscalationEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "escalation.raised"
    severity: str
    source: str
    message: str
    bead: str | None = None
    resolved_when: list[str] = []
    """What resolves it by itself (``EscalationRaise.resolved_when``): the mayor closes it then (``by`` mayor)."""


class EscalationAcked(EscalationEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "escalation.acked"
    by: str


class EscalationReescalated(EscalationEvent, frozen=True, kw_only=True):
    """Nobody acknowledged it in time: one severity up (``level`` counts re-escalations, at most 2)."""

    TYPE: ClassVar[str] = "escalation.reescalated"
    from_severity: str
    to_severity: str
    level: int


class EscalationClosed(EscalationEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "escalation.closed"
    by: str
    reason: str = ""


ESCALATION_EVENTS: tuple[type[Event], ...] = (
    EscalationRaised,
    EscalationAcked,
    EscalationReescalated,
    EscalationClosed,
)
