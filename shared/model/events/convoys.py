"""Events of the convoy aggregate (``gt.evt.convoy.<id>``): beads tracked together."""

from __future__ import annotations

from typing import ClassVar, Literal

from shared.model.events.base import Event

ConvoyStatus = Literal["open", "closed"]


class ConvoyEvent(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "convoy"
    convoy_id: str

    def aggregate_id(self) -> str:
        return self.convoy_id


class ConvoyCreated(ConvoyEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "convoy.created"
    title: str
    beads: list[str] = []
    owned: bool = False
    """An owned convoy closes only when landed."""
    auto: bool = False
    """Created by a sling to track one bead."""


class ConvoyBeadsAdded(ConvoyEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "convoy.beads_added"
    beads: list[str]


class ConvoyClosed(ConvoyEvent, frozen=True, kw_only=True):
    """Final: every tracked bead closed (``landed`` False), or landed by hand (``forced`` while some were open)."""

    TYPE: ClassVar[str] = "convoy.closed"
    landed: bool = False
    forced: bool = False
    closed_beads: int = 0
    total_beads: int = 0


CONVOY_EVENTS: tuple[type[Event], ...] = (ConvoyCreated, ConvoyBeadsAdded, ConvoyClosed)
