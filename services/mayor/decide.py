"""The mayor's decisions: (state, command, context) -> events, or a CommandError. Pure: no I/O, no clock."""

from __future__ import annotations

from typing import Any

from services.mayor.projection import STATUS_RANK, STATUSES, Bead, MayorState, depends_on, is_ancestor
from shared.commands import BeadClaim, BeadClose, BeadCreate, BeadUpdate, Command
from shared.decision import Accepted, DecideContext, NewEvent
from shared.errors import CommandError
from shared.events import BeadClaimed, BeadClosed, BeadCreated, BeadUpdated

MAX_NEW_ID_TRIES = 8


def aggregate_key(cmd: Command) -> str | None:
    """Commands on one bead are decided in order; a create names a bead nobody can know yet."""
    if isinstance(cmd, BeadUpdate | BeadClaim | BeadClose):
        return f"bead:{cmd.id}"
    return None


def decide(state: MayorState, cmd: Command, ctx: DecideContext) -> Accepted:
    """The events ``cmd`` produces on ``state``.

    Raises:
        CommandError: the command cannot be carried out (``not_found``, ``conflict``, ...).
    """
    if isinstance(cmd, BeadCreate):
        return _create(state, cmd, ctx)
    if isinstance(cmd, BeadUpdate):
        return _update(state, cmd)
    if isinstance(cmd, BeadClaim):
        return _claim(state, _bead(state, cmd.id), cmd.assignee)
    if isinstance(cmd, BeadClose):
        return _close(state, _bead(state, cmd.id), cmd.reason)
    raise CommandError("unknown_command", f"the mayor does not handle {type(cmd).__name__}")


def _bead(state: MayorState, bead_id: str, *, field: str = "id") -> Bead:
    bead = state.beads.get(bead_id)
    if bead is None:
        what = "bead" if field == "id" else f"bead named in `{field}`"
        raise CommandError("not_found", f"no {what} {bead_id!r}")
    return bead


def _result(bead_id: str, status: str, *, changed: bool, **extra: Any) -> dict[str, Any]:
    return {"id": bead_id, "status": status, "changed": changed, **extra}


def _create(state: MayorState, cmd: BeadCreate, ctx: DecideContext) -> Accepted:
    if cmd.parent is not None:
        _bead(state, cmd.parent, field="parent")
    for need in cmd.needs:
        _bead(state, need, field="needs")
    for _ in range(MAX_NEW_ID_TRIES):
        bead_id = ctx.new_id(cmd.prefix)
        if bead_id not in state.beads:
            break
    else:
        raise CommandError("conflict", "could not draw an unused bead id; send the command again")
    event = BeadCreated(
        bead_id=bead_id,
        title=cmd.title,
        type=cmd.type,
        priority=cmd.priority,
        description=cmd.description,
        labels=list(dict.fromkeys(cmd.labels)),
        metadata=dict(cmd.metadata),
        parent=cmd.parent,
        needs=list(dict.fromkeys(cmd.needs)),
        assignee=cmd.assignee,
    )
    return Accepted(events=[NewEvent(payload=event, expected_seq=0)], result=_result(bead_id, "open", changed=True))


def _update(state: MayorState, cmd: BeadUpdate) -> Accepted:
    bead = _bead(state, cmd.id)
    target_status = _check_status(bead, cmd.status)
    changes: dict[str, Any] = {}
    for field in ("title", "type", "priority", "description"):
        value = getattr(cmd, field)
        if value is not None and value != getattr(bead, field):
            changes[field] = value
    if cmd.assignee is not None:
        assignee = cmd.assignee or None
        if assignee != bead.assignee:
            changes["assignee"] = assignee
    if cmd.parent is not None:
        parent = cmd.parent or None
        if parent is not None:
            _bead(state, parent, field="parent")
            if is_ancestor(state, bead.id, parent):
                raise CommandError("invalid", f"`parent` {parent!r} would make {bead.id!r} its own ancestor")
        if parent != bead.parent:
            changes["parent"] = parent
    add_labels = [label for label in dict.fromkeys(cmd.labels) if label not in bead.labels]
    remove_labels = [label for label in dict.fromkeys(cmd.remove_labels) if label in bead.labels or label in add_labels]
    metadata = {k: v for k, v in cmd.metadata.items() if bead.metadata.get(k) != v}
    add_needs: list[str] = []
    for need in dict.fromkeys(cmd.needs):
        if need in bead.needs:
            continue
        _bead(state, need, field="needs")
        if need == bead.id or depends_on(state, need, bead.id):
            raise CommandError("invalid", f"`needs` {need!r} would close a dependency cycle through {bead.id!r}")
        add_needs.append(need)

    events: list[NewEvent] = []
    if changes or add_labels or remove_labels or metadata or add_needs:
        update = BeadUpdated(
            bead_id=bead.id,
            add_labels=add_labels,
            remove_labels=remove_labels,
            metadata=metadata,
            add_needs=add_needs,
            **changes,
        )
        events.append(NewEvent(payload=update, expected_seq=bead.version))
    status = bead.status
    if target_status == "in_progress" and bead.status != "in_progress":
        assignee = changes.get("assignee", bead.assignee)
        if not assignee:
            raise CommandError("invalid", "moving a bead to in_progress needs an `assignee`")
        events += _claim(state, bead, assignee, first=not events).events
        status = "in_progress"
    elif target_status == "closed" and bead.status != "closed":
        events += _close(state, bead, "", first=not events).events
        status = "closed"
    return Accepted(events=events, result=_result(bead.id, status, changed=bool(events)))


def _check_status(bead: Bead, status: str | None) -> str | None:
    if status is None:
        return None
    if status not in STATUS_RANK:
        raise CommandError("invalid", f"`status` must be one of {', '.join(STATUSES)}, got {status!r}")
    if STATUS_RANK[status] < STATUS_RANK[bead.status]:
        raise CommandError(
            "backward_transition",
            f"bead {bead.id} is {bead.status}; it cannot go back to {status} "
            "(closed is final: file a new bead that references it)",
        )
    if status == "hooked" and bead.status != "hooked":
        raise CommandError("invalid", "a bead becomes hooked by slinging it to a rig (gt.cmd.bead.sling)")
    return status


def _claim(state: MayorState, bead: Bead, assignee: str, *, first: bool = True) -> Accepted:
    if bead.status == "closed":
        raise CommandError("backward_transition", f"bead {bead.id} is closed; it cannot be claimed again")
    if bead.status == "in_progress":
        if bead.assignee == assignee:
            return Accepted(result=_result(bead.id, bead.status, changed=False, assignee=assignee))
        raise CommandError("conflict", f"bead {bead.id} is already in progress for {bead.assignee!r}")
    event = BeadClaimed(bead_id=bead.id, assignee=assignee)
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=bead.version if first else None)],
        result=_result(bead.id, "in_progress", changed=True, assignee=assignee),
    )


def _close(state: MayorState, bead: Bead, reason: str, *, first: bool = True) -> Accepted:
    if bead.status == "closed":
        return Accepted(result=_result(bead.id, "closed", changed=False))
    event = BeadClosed(bead_id=bead.id, reason=reason)
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=bead.version if first else None)],
        result=_result(bead.id, "closed", changed=True),
    )
