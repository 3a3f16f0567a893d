"""Events of the garbage collector (``gt.evt.gc.town``), written by the deacon.

A sweep does not edit the log (nothing ever does): it is an event every projection folds, dropping what
finished before ``cutoff`` and is no longer needed to decide anything (closed molecules, closed wisps,
cleaned sessions, finished merge requests, old automation runs). Because the sweep is in the log, a fresh
replay drops exactly what the live projections dropped, at the same point.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from shared.model.events.base import Event

TOWN = "town"
"""The one gc aggregate: sweeps are appended with its last sequence expected, so two deacons never both sweep."""


class GcSwept(Event, frozen=True, kw_only=True):
    """Everything finished before ``cutoff`` leaves the projections (the log keeps it)."""

    TYPE: ClassVar[str] = "gc.swept"
    AGGREGATE: ClassVar[str] = "gc"
    cutoff: datetime
    """Things closed, ended or finished before this instant are collected."""
    ttl_s: float
    """How long finished things were kept: ``cutoff`` is the sweep's time minus this."""

    def aggregate_id(self) -> str:
        return TOWN


GC_EVENTS: tuple[type[Event], ...] = (GcSwept,)
