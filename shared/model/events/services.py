"""Events of the service aggregate (``gt.evt.service.<name>``), written by the deacon from service heartbeats."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from shared.model.events.base import Event

ServiceLiveness = Literal["up", "down", "stopped"]
"""A service as the deacon last saw it: up (heartbeats come), down (they stopped), stopped (it said so)."""


class ServiceEvent(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "service"
    service: str
    """mayor, witness, refinery, deacon, or another process that publishes service heartbeats."""

    def aggregate_id(self) -> str:
        return self.service


class ServiceUp(ServiceEvent, frozen=True, kw_only=True):
    """Its heartbeats arrive (first seen, back after being down, or a new instance took over)."""

    TYPE: ClassVar[str] = "service.up"
    instance: str
    pid: int
    host: str = ""


class ServiceDown(ServiceEvent, frozen=True, kw_only=True):
    """No fresh heartbeat: the process died, hangs, or lost NATS. Under `gt up` the supervisor restarts it."""

    TYPE: ClassVar[str] = "service.down"
    instance: str = ""
    reason: str
    last_seen: datetime | None = None


class ServiceStopped(ServiceEvent, frozen=True, kw_only=True):
    """It said goodbye (a clean stop): not a failure."""

    TYPE: ClassVar[str] = "service.stopped"
    instance: str


SERVICE_EVENTS: tuple[type[Event], ...] = (ServiceUp, ServiceDown, ServiceStopped)
