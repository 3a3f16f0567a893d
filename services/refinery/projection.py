"""The refinery's projection: merge requests, plus the beads and rigs a merge request is checked against."""

from __future__ import annotations

import functools

from services.refinery.state import MergeRequest, RefineryState
from shared.events import BeadCreated, BeadSlung, Envelope, Event, MergeRequestSubmitted, RigAdded
from shared.projection import Projection

SCHEMA_VERSION = 1
NOT_WORK = frozenset({"message", "convoy", "escalation"})


@functools.singledispatch
def fold(payload: Event, state: RefineryState, env: Envelope, seq: int) -> None:
    """Events the refinery does not track change nothing."""


@fold.register
def _bead_created(payload: BeadCreated, state: RefineryState, env: Envelope, seq: int) -> None:
    if payload.type not in NOT_WORK:
        state.bead_rigs.setdefault(payload.bead_id, None)


@fold.register
def _bead_slung(payload: BeadSlung, state: RefineryState, env: Envelope, seq: int) -> None:
    if payload.bead_id in state.bead_rigs:
        state.bead_rigs[payload.bead_id] = payload.rig


@fold.register
def _rig_added(payload: RigAdded, state: RefineryState, env: Envelope, seq: int) -> None:
    state.rigs.setdefault(payload.rig, payload.base_branch)


@fold.register
def _submitted(payload: MergeRequestSubmitted, state: RefineryState, env: Envelope, seq: int) -> None:
    if payload.mr_id in state.mrs:
        return
    state.mrs[payload.mr_id] = MergeRequest(
        id=payload.mr_id,
        bead=payload.bead,
        rig=payload.rig,
        branch=payload.branch,
        target=payload.target,
        head=payload.head,
        priority=payload.priority,
        session=payload.session,
        submitted_at=env.ts,
        version=seq,
    )


def new_projection() -> Projection[RefineryState]:
    return Projection("refinery", RefineryState, fold, schema_version=SCHEMA_VERSION)
