"""The deacon's projection: one fold per part of its state (liveness, leases, hooks, the last sweep, the disk
alarm; automations fold their own, ``automations.projection``), and ``fold``, which hands every event to each.
No I/O; each mutates the part it is given (a copy per event would cost a million-event replay dearly)."""

from __future__ import annotations

import functools

from services.deacon.automations import projection as automations
from services.deacon.state import (
    DISK_ALARM_SOURCE,
    DeaconState,
    DiskAlarmState,
    GcState,
    HookedBead,
    HookState,
    LeaseState,
    LivenessState,
    ServiceLife,
)
from shared.core.ids import hook_lease_name
from shared.model import gates
from shared.model.events import (
    BeadClaimed,
    BeadClosed,
    BeadSlung,
    BeadUnslung,
    CiGate,
    Envelope,
    EscalationClosed,
    EscalationRaised,
    Event,
    GcSwept,
    LeaseEvent,
    MergeRequestConflicted,
    MergeRequestFailed,
    MergeRequestRejected,
    MergeRequestSubmitted,
    ServiceDown,
    ServiceStopped,
    ServiceUp,
)
from shared.model.events.beads import forward
from shared.model.leases import fold_lease
from shared.service.projection import Projection

SCHEMA_VERSION = 7
"""5: leases are the one lease record (``shared.model.leases.Lease``), folded as the other services fold theirs.
7: the molecules with a ``ci`` gate (``ci_gates``)."""


def fold(payload: Event, state: DeaconState, env: Envelope, seq: int) -> None:
    fold_liveness(payload, state.liveness, env, seq)
    fold_leases(payload, state.leases, env, seq)
    automations.fold(payload, state.automations, env, seq)
    fold_gc(payload, state.gc, env, seq)
    fold_hooks(payload, state.hooks, env, seq)
    fold_disk(payload, state.disk, env, seq)
    gates.fold_book(state.ci_gates, payload, env.ts, (CiGate,))


def new_projection() -> Projection[DeaconState]:
    return Projection(
        "deacon", DeaconState, fold, schema_version=SCHEMA_VERSION, snapshot_after=frozenset({GcSwept.TYPE})
    )


# ---- liveness: ``service.up``, ``service.down``, ``service.stopped`` (the deacon's own record) ----------------


@functools.singledispatch
def fold_liveness(payload: Event, state: LivenessState, env: Envelope, seq: int) -> None:
    """Other events change nothing here."""


@fold_liveness.register
def _up(payload: ServiceUp, state: LivenessState, env: Envelope, seq: int) -> None:
    state.services[payload.service] = ServiceLife(
        name=payload.service, status="up", instance=payload.instance, since=env.ts, version=seq
    )


@fold_liveness.register
def _down(payload: ServiceDown, state: LivenessState, env: Envelope, seq: int) -> None:
    state.services[payload.service] = ServiceLife(
        name=payload.service,
        status="down",
        instance=payload.instance,
        since=env.ts,
        reason=payload.reason,
        version=seq,
    )


@fold_liveness.register
def _stopped(payload: ServiceStopped, state: LivenessState, env: Envelope, seq: int) -> None:
    state.services[payload.service] = ServiceLife(
        name=payload.service, status="stopped", instance=payload.instance, since=env.ts, version=seq
    )


# ---- leases: every lease, through the one lease record's fold ----------------------------------------------


@functools.singledispatch
def fold_leases(payload: Event, state: LeaseState, env: Envelope, seq: int) -> None:
    """Other events change nothing here."""


@fold_leases.register
def _lease(payload: LeaseEvent, state: LeaseState, env: Envelope, seq: int) -> None:
    fold_lease(payload, state.leases, env, seq)


# ---- hooks: slung beads not closed yet, and the merge requests that free their hooks ------------------------


@functools.singledispatch
def fold_hooks(payload: Event, state: HookState, env: Envelope, seq: int) -> None:
    """Other events change nothing here."""


@fold_hooks.register
def _slung(payload: BeadSlung, state: HookState, env: Envelope, seq: int) -> None:
    bead = state.beads.get(payload.bead_id)
    if bead is None:
        bead = state.beads[payload.bead_id] = HookedBead(id=payload.bead_id)
        state.by_lease[hook_lease_name(payload.bead_id)] = payload.bead_id
    if bead.merge_pending is not None:
        state.mr_beads.pop(bead.merge_pending, None)
        bead.merge_pending = None


@fold_hooks.register
def _claimed(payload: BeadClaimed, state: HookState, env: Envelope, seq: int) -> None:
    if (bead := state.beads.get(payload.bead_id)) is not None:
        bead.status = forward(bead.status, "in_progress")


def _untrack(state: HookState, bead_id: str) -> None:
    bead = state.beads.pop(bead_id, None)
    if bead is not None:
        state.by_lease.pop(hook_lease_name(bead.id), None)
        if bead.merge_pending is not None:
            state.mr_beads.pop(bead.merge_pending, None)


@fold_hooks.register
def _closed(payload: BeadClosed, state: HookState, env: Envelope, seq: int) -> None:
    _untrack(state, payload.bead_id)


@fold_hooks.register
def _unslung(payload: BeadUnslung, state: HookState, env: Envelope, seq: int) -> None:
    """An operator gave the hook back: its lease is released on purpose, never a stale hook (until slung again)."""
    _untrack(state, payload.bead_id)


@fold_hooks.register
def _submitted(payload: MergeRequestSubmitted, state: HookState, env: Envelope, seq: int) -> None:
    if (bead := state.beads.get(payload.bead)) is not None:
        if bead.merge_pending is not None:
            state.mr_beads.pop(bead.merge_pending, None)
        bead.merge_pending = payload.mr_id
        state.mr_beads[payload.mr_id] = bead.id


def _mr_ended(state: HookState, mr_id: str) -> None:
    bead_id = state.mr_beads.pop(mr_id, None)
    bead = state.beads.get(bead_id or "")
    if bead is not None and bead.merge_pending == mr_id:
        bead.merge_pending = None


@fold_hooks.register
def _mr_failed(payload: MergeRequestFailed, state: HookState, env: Envelope, seq: int) -> None:
    _mr_ended(state, payload.mr_id)


@fold_hooks.register
def _mr_conflicted(payload: MergeRequestConflicted, state: HookState, env: Envelope, seq: int) -> None:
    if payload.sent_back:  # finished: the agent resolves it in a fresh session (a blocked one still waits)
        _mr_ended(state, payload.mr_id)


@fold_hooks.register
def _mr_rejected(payload: MergeRequestRejected, state: HookState, env: Envelope, seq: int) -> None:
    _mr_ended(state, payload.mr_id)


# ---- gc: the last sweep ----------------------------------------------------------------------------------


@functools.singledispatch
def fold_gc(payload: Event, state: GcState, env: Envelope, seq: int) -> None:
    """Other events change nothing here."""


@fold_gc.register
def _swept(payload: GcSwept, state: GcState, env: Envelope, seq: int) -> None:
    state.last_swept_at = env.ts
    state.cutoff = payload.cutoff
    state.ttl_s = payload.ttl_s
    state.sweeps += 1
    state.version = seq


# ---- disk: the disk alarm's open escalation ----------------------------------------------------------------


@functools.singledispatch
def fold_disk(payload: Event, state: DiskAlarmState, env: Envelope, seq: int) -> None:
    """Other events change nothing here."""


@fold_disk.register
def _raised(payload: EscalationRaised, state: DiskAlarmState, env: Envelope, seq: int) -> None:
    if payload.source == DISK_ALARM_SOURCE:
        state.open = payload.escalation_id
        state.raised += 1


@fold_disk.register
def _escalation_closed(payload: EscalationClosed, state: DiskAlarmState, env: Envelope, seq: int) -> None:
    if payload.escalation_id == state.open:
        state.open = None  # closed by the deacon, or by a person (raised again if space is still low)
