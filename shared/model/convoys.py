"""A convoy as the mayor keeps it and shows it: the record of its projection, and (``ConvoyView``) the answer of
``gt.q.mayor.convoys`` and ``convoy``, the record with its progress (and for ``convoy``, each bead's place). Pure
data."""

from __future__ import annotations

from datetime import datetime

import msgspec

from shared.model.events.beads import BeadStatus
from shared.model.events.convoys import ConvoyStatus


class Convoy(msgspec.Struct, kw_only=True, gc=False):
    id: str
    title: str
    beads: list[str] = []
    owned: bool = False
    auto: bool = False
    status: ConvoyStatus = "open"
    created_at: datetime
    created_by: str = ""
    closed_at: datetime | None = None
    landed: bool = False
    forced: bool = False
    version: int = 0


class DispatchView(msgspec.Struct, kw_only=True, gc=False):
    """A convoy's bead: where it is, its wave, and (while open) what it waits for and the rig it is held for."""

    id: str
    title: str
    status: BeadStatus
    rig: str | None = None
    wave: int = 0
    waiting_for: list[str] = []
    held_for: str | None = None


class ConvoyView(Convoy, kw_only=True, gc=False):
    """A convoy as ``convoys`` lists it (its progress) and ``convoy`` shows it (its beads too: the fields left out
    of a list's JSON)."""

    closed: int = 0
    total: int = 0
    bead_details: list[DispatchView] | msgspec.UnsetType = msgspec.UNSET
    held: int | msgspec.UnsetType = msgspec.UNSET
    """How many of its beads wait in a hold (``convoy`` only)."""
