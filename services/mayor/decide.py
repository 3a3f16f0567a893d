"""The mayor's decisions: (state, command, context) -> events, or a CommandError. Pure: no I/O, no clock."""

from __future__ import annotations

from typing import Any

import msgspec

from services.mayor.projection import STATUS_RANK, Bead, MayorState, depends_on
from shared.commands import BeadClaim, BeadClose, BeadCreate, BeadUpdate, Command
from shared.decision import Accepted, DecideContext, NewEvent
from shared.errors import CommandError
from shared.events import BeadClaimed, BeadClosed, BeadCreated, BeadUpdated

MAX_NEW_ID_TRIES = 8


def aggregate_key(cmd: Command) -> str | None:
    """Commands on one bead are decided in order; creates touch a bead nobody else can know yet."""
    if isinstance(cmd, BeadUpdate | BeadClaim | BeadClose):
        return f"bead:{cmd.id}"
    return None


def decide(state: MayorState, cmd: Command, ctx: DecideContext) -> Accepted:
    if isinstance(cmd, BeadCreate):
        return _create(state, cmd, ctx)
    if isinstance(cmd, BeadUpdate):
        return _update(state, cmd)
    if isinstance(cmd, BeadClaim):
        return _claim(state, cmd)
    if isinstance(cmd, BeadClose):
        return _close(state, cmd)
    raise CommandError("unknown_command", f"the mayor does not handle {type(cmd).__name__}")


def _bead(state: MayorState, bead_id: str) -> Bead:
    bead = state.beads.get(bead_id)
    if bead is None:
        raise CommandError("not_found", f"no bead {bead_id!r}")
    return bead


def _create(state: MayorState, cmd: BeadCreate, ctx: DecideContext) -> Accepted:
    if cmd.parent is not None:
        _bead(state, cmd.parent)
    for need in cmd.needs:
        _bead(state, need)
    for _ in range(MAX_NEW_ID_TRIES):
        bead_id: str = ctx.new_id(cmd.prefix)
        if bead_id not in state.beads:
            break
    else:
        raise CommandError("conflict", "could not draw an unused bead id; retry")
    labels = list(dict.fromkeys(cmd.labels))
    event = BeadCreated(
        bead_id=bead_id,
        title=cmd.title,
        type=cmd.type,
        priority=cmd.priority,
        description=cmd.description,
        labels=labels,
        metadata=dict(cmd.metadata),
        parent=cmd.parent,
        needs=list(dict.fromkeys(cmd.needs)),
        assignee=cmd.assignee,
    )
    return Accepted(events=[NewEvent(payload=event, expected_seq=0)], result={"id": bead_id, "status": "open"})


def _update(state: MayorState, cmd: BeadUpdate) -> Accepted:
    bead = _bead(state, cmd.id)
    changes: dict[str, Any] = {}
    if cmd.title is not None and cmd.title != bead.title:
        changes["title"] = cmd.title
    if cmd.type is not None and cmd.type != bead.type:
        changes["type"] = cmd.type
    if cmd.priority is not None and cmd.priority != bead.priority:
        changes["priority"] = cmd.priority
    if cmd.description is not None and cmd.description != bead.description:
        changes["description"] = cmd.description
    if cmd.assignee is not None and cmd.assignee != bead.assignee:
        changes["assignee"] = cmd.assignee
    if cmd.parent is not None and cmd.parent != bead.parent:
        if cmd.parent == bead.id:
            raise CommandError("invalid", "a bead cannot be its own parent")
        _bead(state, cmd.parent)
        changes["parent"] = cmd.parent
    add_labels = [label for label in dict.fromkeys(cmd.labels) if label not in bead.labels]
    remove_labels = [label for label in dict.fromkeys(cmd.remove_labels) if label in bead.labels or label in add_labels]
    metadata = {k: v for k, v in cmd.metadata.items() if bead.metadata.get(k) != v}
    add_needs: list[str] = []
    for need in dict.fromkeys(cmd.needs):
        if need in bead.needs:
            continue
        if need == bead.id or depends_on(state, need, bead.id):
            raise CommandError("invalid", f"`needs` {need!r} would close a dependency cycle through {bead.id!r}")
        _bead(state, need)
        add_needs.append(need)
    if cmd.status is not None:
        _check_status_change(bead, cmd.status)
    if not (changes or add_labels or remove_labels or metadata or add_needs):
        return Accepted(result={"id": bead.id, "status": bead.status, "changed": False})
    event = BeadUpdated(
        bead_id=bead.id,
        add_labels=add_labels,
        remove_labels=remove_labels,
        metadata=metadata,
        add_needs=add_needs,
        **changes,
    )
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=bead.version)],
        result={"id": bead.id, "status": bead.status, "changed": True},
    )


def _check_status_change(bead: Bead, status: str) -> None:
    if status not in STATUS_RANK:
        raise CommandError("invalid", f"`status` must be one of {', '.join(STATUS_RANK)}, got {status!r}")
    if STATUS_RANK[status] < STATUS_RANK[bead.status]:
        raise CommandError(
            "backward_transition",
            f"bead {bead.id} is {bead.status}; it cannot go back to {status} (file a new bead that references it)",
        )
    if status != bead.status:
        verb = {"in_progress": "gt.cmd.bead.claim", "closed": "gt.cmd.bead.close", "hooked": "gt.cmd.bead.sling"}
        raise CommandError("invalid", f"move a bead to {status} with {verb[status]}, not with update")


def _claim(state: MayorState, cmd: BeadClaim) -> Accepted:
    bead = _bead(state, cmd.id)
    if bead.status == "closed":
        raise CommandError("backward_transition", f"bead {bead.id} is closed; it cannot be claimed again")
    if bead.status == "in_progress":
        if bead.assignee == cmd.assignee:
            return Accepted(result={"id": bead.id, "status": bead.status, "assignee": bead.assignee, "changed": False})
        raise CommandError("conflict", f"bead {bead.id} is already in progress for {bead.assignee!r}")
    event = BeadClaimed(bead_id=bead.id, assignee=cmd.assignee)
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=bead.version)],
        result={"id": bead.id, "status": "in_progress", "assignee": cmd.assignee, "changed": True},
    )


def _close(state: MayorState, cmd: BeadClose) -> Accepted:
    bead = _bead(state, cmd.id)
    if bead.status == "closed":
        return Accepted(result={"id": bead.id, "status": "closed", "changed": False})
    event = BeadClosed(bead_id=bead.id, reason=cmd.reason)
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=bead.version)],
        result={"id": bead.id, "status": "closed", "changed": True},
    )


def bead_view(bead: Bead) -> dict[str, Any]:
    view: dict[str, Any] = msgspec.to_builtins(bead)
    return view
