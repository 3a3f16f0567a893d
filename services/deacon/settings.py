"""How the deacon watches: read from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping

import msgspec

from services.deacon.plan.liveness import WATCHED
from shared.core.config import env_number


class DeaconSettings(msgspec.Struct, frozen=True, kw_only=True):
    stale_after_s: float = 3.0
    """A service whose freshest heartbeat is older than this is down (``GT_SERVICE_STALE_AFTER``)."""
    startup_grace_s: float = 15.0
    """A watched service that never reported is down after this (``GT_SERVICE_STARTUP_GRACE``)."""
    escalate_after_s: float = 60.0
    """A service down this long is escalated (``GT_SERVICE_ESCALATE_AFTER``)."""
    watched: tuple[str, ...] = WATCHED
    """Services expected to run (``GT_WATCHED_SERVICES``, comma-separated; empty: none)."""
    tick_s: float = 0.5
    """Seconds between liveness and lease checks (``GT_DEACON_TICK``)."""
    gc_ttl_s: float = 604_800.0
    """Closed and finished things older than this leave the projections at a sweep (``GT_GC_TTL``, seconds)."""
    gc_interval_s: float = 3600.0
    """Seconds between automatic sweeps (``GT_GC_INTERVAL``; 0: only ``gt gc``)."""
    stale_hook_after_s: float = 600.0
    """A working bead whose hook lease lapsed this long ago, nobody taking it since and no merge request
    waiting, is handed to the witness to re-sling or escalate (``GT_STALE_HOOK_AFTER``)."""
    disk_low_percent: float = 10.0
    """Escalate while a watched volume, or the NATS account's JetStream storage limit, has less than this percent
    free (``GT_DISK_LOW_PERCENT``; 0: no alarm)."""
    disk_paths: tuple[str, ...] | None = None
    """Paths whose volumes are watched (``GT_DISK_WATCH``, comma-separated; default: ``$GT_HOME`` and
    ``$GT_HOME/nats/jetstream``, where `gt up` keeps the JetStream store, each when it exists)."""
    disk_check_s: float = 30.0
    """Seconds between disk-space checks (``GT_DISK_CHECK_INTERVAL``)."""
    gate_poll_s: float = 30.0
    """Seconds between two runs of a waiting ``ci`` gate's check (``GT_GATE_POLL``)."""
    gate_timeout_s: float = 300.0
    """How long one run of a ``ci`` gate's check may take before it is stopped and counts as failed
    (``GT_GATE_TIMEOUT``)."""


def load(env: Mapping[str, str] | None = None) -> DeaconSettings:
    """Raises ValueError naming a setting whose value cannot be used."""
    env = os.environ if env is None else env
    watched = env.get("GT_WATCHED_SERVICES")
    disk = env.get("GT_DISK_WATCH")
    return DeaconSettings(
        stale_after_s=env_number(env, "GT_SERVICE_STALE_AFTER", 3.0, minimum=0.5),
        startup_grace_s=env_number(env, "GT_SERVICE_STARTUP_GRACE", 15.0, minimum=0.0),
        escalate_after_s=env_number(env, "GT_SERVICE_ESCALATE_AFTER", 60.0, minimum=1.0),
        watched=WATCHED if watched is None else tuple(s.strip() for s in watched.split(",") if s.strip()),
        tick_s=env_number(env, "GT_DEACON_TICK", 0.5, minimum=0.05),
        gc_ttl_s=env_number(env, "GT_GC_TTL", 604_800.0, minimum=0.0),
        gc_interval_s=env_number(env, "GT_GC_INTERVAL", 3600.0, minimum=0.0),
        stale_hook_after_s=env_number(env, "GT_STALE_HOOK_AFTER", 600.0, minimum=0.0),
        disk_low_percent=env_number(env, "GT_DISK_LOW_PERCENT", 10.0, minimum=0.0),
        disk_paths=None if disk is None else tuple(p.strip() for p in disk.split(",") if p.strip()),
        disk_check_s=env_number(env, "GT_DISK_CHECK_INTERVAL", 30.0, minimum=0.05),
        gate_poll_s=env_number(env, "GT_GATE_POLL", 30.0, minimum=0.1),
        gate_timeout_s=env_number(env, "GT_GATE_TIMEOUT", 300.0, minimum=1.0),
    )
