"""How a service runs (flags of ``gt-<name>``)."""

from __future__ import annotations

import msgspec


class ServiceSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How a service runs (flags of ``gt-<name>``); the town's wiring is in ``TownConfig``."""

    patrol_interval: float = 5.0
    """Seconds between reconcile ticks when nothing happens."""
    use_snapshots: bool = True
    """Start from the newest snapshot (then replay the tail) and store new ones."""
    snapshot_every: int = 50_000
    """Store a snapshot once this many events were applied since the last one (0 = only at shutdown)."""
    snapshot_check_interval: float = 30.0
    """Seconds between checks whether a snapshot is due."""
    idle_heartbeat: float = 2.0
    """Heartbeat of the log subscription; a lost subscription is noticed within a few of these."""
    max_in_flight: int = 4_096
    """Commands being settled at once (the rest wait in GT_CMD)."""
    heartbeat_interval: float = 1.0
    """Seconds between this service's heartbeats in the ``GT_SERVICES`` bucket (0: none); the deacon calls a
    service down when it misses a few."""
    active_ttl: float = 6.0
    """Seconds of the scope's activity key (``GT_ACTIVE_TTL``): renewed every third of it; the holder stops
    acting two thirds of it after its last renewal; a standby takes a key over once unchanged for all of it."""
