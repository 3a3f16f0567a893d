"""The deacon's projection: each part of its state folds the events it cares about."""

from __future__ import annotations

from services.deacon.automations import state as automation_state
from services.deacon.plan import disk, gc, hooks, leases, liveness
from services.deacon.state import DeaconState
from shared.events import Envelope, Event, GcSwept
from shared.projection import Projection

SCHEMA_VERSION = 6
"""5: leases are the one lease record (``shared.lease_state.Lease``), folded as the other services fold theirs."""


def fold(payload: Event, state: DeaconState, env: Envelope, seq: int) -> None:
    liveness.fold(payload, state.liveness, env, seq)
    leases.fold(payload, state.leases, env, seq)
    automation_state.fold(payload, state.automations, env, seq)
    gc.fold(payload, state.gc, env, seq)
    hooks.fold(payload, state.hooks, env, seq)
    disk.fold(payload, state.disk, env, seq)


def new_projection() -> Projection[DeaconState]:
    return Projection(
        "deacon", DeaconState, fold, schema_version=SCHEMA_VERSION, snapshot_after=frozenset({GcSwept.TYPE})
    )
