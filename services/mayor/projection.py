"""The mayor's projection: every bead, folded from the log. Pure: no I/O, no clock."""

from __future__ import annotations

import functools
from datetime import datetime

import msgspec

from shared.events import (
    BeadClaimed,
    BeadClosed,
    BeadCreated,
    BeadUpdated,
    CommandAccepted,
    CommandRejected,
    Envelope,
    Event,
)
from shared.projection import Projection

SCHEMA_VERSION = 1
STATUSES = ("open", "hooked", "in_progress", "closed")
STATUS_RANK = {status: rank for rank, status in enumerate(STATUSES)}
INFRA_TYPES = frozenset(
    {"molecule", "wisp", "message", "gate", "merge-request", "session", "agent", "role", "rig", "convoy"}
)
"""Types that are plumbing, not work: never offered by ``ready``."""


class Bead(msgspec.Struct, kw_only=True, gc=False):
    """One work item as the mayor knows it."""

    id: str
    title: str
    type: str = "task"
    status: str = "open"
    priority: int = 2
    description: str = ""
    labels: list[str] = []
    metadata: dict[str, str] = {}
    assignee: str | None = None
    parent: str | None = None
    needs: list[str] = []
    """Blocking dependencies: the bead is not ready while one of these is not closed."""
    created_at: datetime
    updated_at: datetime
    closed_at: datetime | None = None
    close_reason: str | None = None
    created_by: str = ""
    version: int = 0
    """Stream sequence of this bead's last event: the expected sequence for its next append."""


class MayorState(msgspec.Struct, kw_only=True):
    beads: dict[str, Bead] = {}
    """Every bead, in creation order."""
    children: dict[str, list[str]] = {}
    """Parent id -> child ids, in creation order."""
    commands_accepted: int = 0
    commands_rejected: int = 0


@functools.singledispatch
def fold(payload: Event, state: MayorState, env: Envelope, seq: int) -> None:
    """Events the mayor does not track change nothing."""


@fold.register
def _created(payload: BeadCreated, state: MayorState, env: Envelope, seq: int) -> None:
    if payload.bead_id in state.beads:
        return  # the log's expected-sequence check makes this impossible; a fold still never double-counts
    state.beads[payload.bead_id] = Bead(
        id=payload.bead_id,
        title=payload.title,
        type=payload.type,
        priority=payload.priority,
        description=payload.description,
        labels=list(payload.labels),
        metadata=dict(payload.metadata),
        assignee=payload.assignee,
        parent=payload.parent,
        needs=list(payload.needs),
        created_at=env.ts,
        updated_at=env.ts,
        created_by=env.actor,
        version=seq,
    )
    if payload.parent:
        state.children.setdefault(payload.parent, []).append(payload.bead_id)


@fold.register
def _updated(payload: BeadUpdated, state: MayorState, env: Envelope, seq: int) -> None:
    bead = state.beads.get(payload.bead_id)
    if bead is None:
        return
    if payload.title is not msgspec.UNSET:
        bead.title = payload.title
    if payload.type is not msgspec.UNSET:
        bead.type = payload.type
    if payload.priority is not msgspec.UNSET:
        bead.priority = payload.priority
    if payload.description is not msgspec.UNSET:
        bead.description = payload.description
    if payload.assignee is not msgspec.UNSET:
        bead.assignee = payload.assignee
    if payload.parent is not msgspec.UNSET and payload.parent != bead.parent:
        siblings = state.children.get(bead.parent or "", [])
        if bead.id in siblings:
            siblings.remove(bead.id)
            if not siblings:
                del state.children[bead.parent or ""]
        bead.parent = payload.parent
        if payload.parent:
            state.children.setdefault(payload.parent, []).append(bead.id)
    # Adds before removes, as the bead store contract has it.
    for label in payload.add_labels:
        if label not in bead.labels:
            bead.labels.append(label)
    if payload.remove_labels:
        bead.labels = [label for label in bead.labels if label not in payload.remove_labels]
    if payload.metadata:
        bead.metadata.update(payload.metadata)
    for need in payload.add_needs:
        if need not in bead.needs:
            bead.needs.append(need)
    bead.updated_at = env.ts
    bead.version = seq


@fold.register
def _claimed(payload: BeadClaimed, state: MayorState, env: Envelope, seq: int) -> None:
    bead = state.beads.get(payload.bead_id)
    if bead is None:
        return
    if STATUS_RANK[bead.status] < STATUS_RANK["in_progress"]:
        bead.status = "in_progress"
    bead.assignee = payload.assignee
    bead.updated_at = env.ts
    bead.version = seq


@fold.register
def _closed(payload: BeadClosed, state: MayorState, env: Envelope, seq: int) -> None:
    bead = state.beads.get(payload.bead_id)
    if bead is None:
        return
    if bead.status != "closed":
        bead.status = "closed"
        bead.closed_at = env.ts
        bead.close_reason = payload.reason
    bead.updated_at = env.ts
    bead.version = seq


@fold.register
def _accepted(payload: CommandAccepted, state: MayorState, env: Envelope, seq: int) -> None:
    state.commands_accepted += 1


@fold.register
def _rejected(payload: CommandRejected, state: MayorState, env: Envelope, seq: int) -> None:
    state.commands_rejected += 1


def new_projection() -> Projection[MayorState]:
    return Projection("mayor", MayorState, fold, schema_version=SCHEMA_VERSION)


# ---- reads (pure) -------------------------------------------------------------------------------


def is_ready(state: MayorState, bead: Bead) -> bool:
    """Open, real work, and every blocker closed (a blocker that does not exist blocks)."""
    if bead.status != "open" or bead.type in INFRA_TYPES:
        return False
    for need in bead.needs:
        blocker = state.beads.get(need)
        if blocker is None or blocker.status != "closed":
            return False
    return True


def depends_on(state: MayorState, start: str, target: str) -> bool:
    """True when ``start`` transitively needs ``target``."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        current = stack.pop()
        if current == target:
            return True
        if current in seen:
            continue
        seen.add(current)
        bead = state.beads.get(current)
        if bead is not None:
            stack.extend(bead.needs)
    return False


def is_ancestor(state: MayorState, candidate: str, bead_id: str) -> bool:
    """True when ``candidate`` is ``bead_id`` or one of its parents, grandparents, ..."""
    seen: set[str] = set()
    current: str | None = bead_id
    while current is not None and current not in seen:
        if current == candidate:
            return True
        seen.add(current)
        bead = state.beads.get(current)
        current = bead.parent if bead is not None else None
    return False
