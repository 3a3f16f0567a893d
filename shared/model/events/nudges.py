"""Events of the nudge aggregate (``gt.evt.nudge.<id>``): a message typed into an agent's pane."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from shared.model.events.base import Event

NudgeStatus = Literal["queued", "delivered", "expired"]


class NudgeEvent(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "nudge"
    nudge_id: str

    def aggregate_id(self) -> str:
        return self.nudge_id


class NudgeQueued(NudgeEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "nudge.queued"
    rig: str
    polecat: str
    session: str | None = None
    """A specific session; None: whichever session the polecat has when it can be delivered."""
    bead: str | None = None
    """The bead the nudge is about (the named session's, or the one the polecat worked when nudged): delivered
    only to a session of that bead, expired once it is closed. None: the polecat had no work then (any session)."""
    message: str
    expires_at: datetime


class NudgeDelivered(NudgeEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "nudge.delivered"
    session: str
    attempts: int = 1


class NudgeExpired(NudgeEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "nudge.expired"
    reason: str = "ttl"


NUDGE_EVENTS: tuple[type[Event], ...] = (NudgeQueued, NudgeDelivered, NudgeExpired)
