"""Service liveness: which services are up, down or stopped, from their heartbeats. Pure.

Heartbeats (``GT_SERVICES`` KV, one key per service process) are a cache; the deacon turns what it sees into
``service.up``, ``service.down`` and ``service.stopped`` events, and those are the record. A "service" here is a
service scope (``witness``, ``witness-east``, ...). A service is down when its freshest heartbeat from a process
that is not a standby is older than ``stale_after_s``: standbys beat too, but a standby alone is no service
(nothing acts), and its beats never make the recorded instance flap. One that never reported is down once the
deacon has been watching for ``startup_grace_s``. A service down for ``escalate_after_s`` is escalated once per
down event (under `gt up` the supervisor has restarted it long before; under docker-compose the container's
restart policy acts and the escalation tells a person).
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from services.deacon.state import LivenessState
from shared.model.decision import NewEvent
from shared.model.events import ServiceDown, ServiceStopped, ServiceUp
from shared.model.heartbeats import ServiceHeartbeat

WATCHED = ("mayor", "witness", "refinery")
"""The services the deacon expects by default (it does not watch itself: the supervisor does)."""


class Policy(msgspec.Struct, frozen=True, kw_only=True):
    stale_after_s: float = 3.0
    startup_grace_s: float = 10.0
    escalate_after_s: float = 60.0
    expected: tuple[str, ...] = WATCHED


class Escalation(msgspec.Struct, frozen=True, kw_only=True):
    command_id: str
    service: str
    message: str


class Owed(msgspec.Struct, frozen=True, kw_only=True):
    events: list[NewEvent]
    escalations: list[Escalation]


def _age(beat: ServiceHeartbeat, now: datetime) -> float:
    return (now - beat.ts).total_seconds()


def plan(
    state: LivenessState, beats: list[ServiceHeartbeat], now: datetime, watching_since: datetime, policy: Policy
) -> Owed:
    """The service events and escalations owed for what the heartbeats show now."""
    by_service: dict[str, list[ServiceHeartbeat]] = {}
    for beat in beats:
        by_service.setdefault(beat.service, []).append(beat)
    names = sorted({*policy.expected, *by_service, *state.services})
    events: list[NewEvent] = []
    escalations: list[Escalation] = []
    for name in names:
        life = state.services.get(name)
        expected_seq = life.version if life is not None else 0
        seen = sorted(by_service.get(name, []), key=lambda b: b.ts, reverse=True)
        fresh = [b for b in seen if not b.stopping and not b.standby and _age(b, now) <= policy.stale_after_s]
        if fresh:
            if life is not None and life.status == "up" and any(b.instance == life.instance for b in fresh):
                continue  # the recorded instance still beats (another instance starting up changes nothing)
            if life is not None and life.status == "up":
                # Another process beats now (a restart, a standby taking over): the recorded one is down first,
                # so every restart shows in the log as down, then up.
                mine = [b for b in seen if b.instance == life.instance]
                if not (mine and mine[0].stopping):
                    reason = f"replaced by {fresh[0].instance}" + (
                        f" (no heartbeat for {_age(mine[0], now):.1f} s)" if mine else ""
                    )
                    down = ServiceDown(
                        service=name, instance=life.instance, reason=reason, last_seen=mine[0].ts if mine else None
                    )
                    events.append(NewEvent(payload=down, expected_seq=expected_seq))
                    continue
            beat = fresh[0]
            up = ServiceUp(service=name, instance=beat.instance, pid=beat.pid, host=beat.host)
            events.append(NewEvent(payload=up, expected_seq=expected_seq))
            continue
        if life is not None and life.status == "up":
            mine = [b for b in seen if b.instance == life.instance]
            if mine and mine[0].stopping:
                events.append(
                    NewEvent(payload=ServiceStopped(service=name, instance=life.instance), expected_seq=expected_seq)
                )
                continue
            last = mine[0].ts if mine else None
            reason = f"no heartbeat for {_age(mine[0], now):.1f} s" if mine else "its heartbeats are gone"
            down = ServiceDown(service=name, instance=life.instance, reason=reason, last_seen=last)
            events.append(NewEvent(payload=down, expected_seq=expected_seq))
            continue
        if life is None:
            if name in policy.expected and (now - watching_since).total_seconds() >= policy.startup_grace_s:
                down = ServiceDown(
                    service=name, reason=f"no heartbeat since the deacon started watching {watching_since:%H:%M:%S}"
                )
                events.append(NewEvent(payload=down, expected_seq=0))
            continue
        if life.status == "down" and (now - life.since).total_seconds() >= policy.escalate_after_s:
            message = (
                f"service {name} has been down since {life.since:%Y-%m-%d %H:%M:%S} UTC ({life.reason}); "
                "under `gt up` it is restarted automatically, so it is crash-looping or cannot start: see its log"
            )
            escalations.append(
                Escalation(command_id=f"service-down-{name}-{life.version}", service=name, message=message)
            )
    return Owed(events=events, escalations=escalations)


def family_down(state: LivenessState, service: str) -> list[str]:
    """The scopes of ``service`` recorded down: ``witness`` and every ``witness-<scope>``."""
    return sorted(
        name
        for name, life in state.services.items()
        if life.status == "down" and (name == service or name.startswith(f"{service}-"))
    )
