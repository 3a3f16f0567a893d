"""Garbage collection of the projections: when a sweep is due, the event it appends, and which KV entries of
dead things go with it. Pure: the time comes in as ``now``.

A sweep is a ``gc.swept`` event on ``gt.evt.gc.town``; every projection folds it (dropping what finished before
its cutoff), so a fresh replay drops the same things at the same point and equals the live projections. The
deacon appends one every ``GT_GC_INTERVAL`` seconds (and on ``gt.cmd.gc.sweep``) with the aggregate's last
sequence expected: two deacons never both sweep. After each sweep it purges KV entries nobody reads any more
(``select_*`` below say which; ``gc_kv`` does it).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from services.deacon.state import GcState, LeaseState, LivenessState
from shared.bus import lease_kv as lease_kv
from shared.model import heartbeats
from shared.model.decision import NewEvent
from shared.model.events import GcSwept

ENDED_LEASES = ("released", "expired")

KvEntries = Mapping[str, tuple[bytes, int]]
"""Key -> (value, revision) of a KV bucket as read now."""


def due(state: GcState, now: datetime, interval_s: float, watching_since: datetime) -> bool:
    """An automatic sweep is owed: sweeping is on (``interval_s`` > 0) and none happened for ``interval_s``. A
    town that never swept waits one interval after the deacon began watching (a fresh town sweeps nothing)."""
    if interval_s <= 0:
        return False
    last = state.last_swept_at or watching_since
    return (now - last).total_seconds() >= interval_s


def sweep(state: GcState, now: datetime, ttl_s: float) -> NewEvent:
    """The sweep to append now, expecting the last one recorded (a deacon that swept meanwhile wins)."""
    return NewEvent(payload=GcSwept(cutoff=now - timedelta(seconds=ttl_s), ttl_s=ttl_s), expected_seq=state.version)


# ---- KV entries of dead things --------------------------------------------------------------------


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def select_leases(state: LeaseState, entries: KvEntries, cutoff: datetime) -> list[tuple[str, int]]:
    """Renewal entries of leases the log says are released or expired, last written before ``cutoff``.

    The lease records themselves stay in the projection (their tokens keep counting up). An entry of a newer
    token than the log knows (an acquisition not applied here yet) or one renewed after the cutoff stays.
    """
    out = []
    for key, (value, revision) in entries.items():
        lease = state.leases.get(key)
        if lease is None or lease.status not in ENDED_LEASES:
            continue
        renewal = lease_kv.decode_renewal(value)
        if renewal is not None and (renewal.token > lease.token or _aware(renewal.renewed_at) >= cutoff):
            continue
        out.append((key, revision))
    return out


def select_heartbeats(entries: KvEntries, cutoff: datetime) -> list[tuple[str, int]]:
    """Agent heartbeats older than ``cutoff`` (an unreadable one is left alone)."""
    out = []
    for key, (value, revision) in entries.items():
        beat = heartbeats.decode_agent(value)
        if beat is not None and beat.ts < cutoff:
            out.append((key, revision))
    return out


def select_services(liveness: LivenessState, entries: KvEntries, cutoff: datetime) -> list[tuple[str, int]]:
    """Last heartbeats of service processes that stopped cleanly before ``cutoff``. One whose stop the log has
    not recorded yet (the service is still up there with that instance) stays: it is what says "stopped"."""
    out = []
    for key, (value, revision) in entries.items():
        beat = heartbeats.decode(value)
        if beat is None or not beat.stopping or _aware(beat.ts) >= cutoff:
            continue
        life = liveness.services.get(beat.service)
        if life is not None and life.status == "up" and life.instance == beat.instance:
            continue
        out.append((key, revision))
    return out
