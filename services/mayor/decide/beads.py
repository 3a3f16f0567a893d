"""Decisions on beads: create, update (with dependencies), claim, close. Pure: no I/O, no clock."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from services.mayor.state import STATUS_RANK, STATUSES, Bead, MayorState, depends_on, is_ancestor
from shared.core.errors import CommandError
from shared.model.commands import BeadCreate, BeadSling, BeadUpdate
from shared.model.commands.actors import TOWN_AGENT_PREFIX
from shared.model.decision import Accepted, DecideContext, NewEvent
from shared.model.events import BeadClaimed, BeadClosed, BeadCreated, BeadUpdated
from shared.model.events.beads import WORK_TYPES
from shared.model.results import BeadResult

MAX_NEW_ID_TRIES = 8


def get_bead(state: MayorState, bead_id: str, *, field: str = "id") -> Bead:
    bead = state.beads.get(bead_id)
    if bead is None:
        what = "bead" if field == "id" else f"bead named in `{field}`"
        raise CommandError("not_found", f"no {what} {bead_id!r}")
    return bead


def fresh_id(ctx: DecideContext, prefix: str, taken: Collection[str], chosen: str | None = None) -> str:
    """A new id: ``chosen`` (the command's ``new_id``, refused when taken), else one drawn that is not taken."""
    if chosen is not None:
        if chosen in taken:
            raise CommandError(
                "conflict", f"the id {chosen} is taken; send the command again without `new_id` (or with another)"
            )
        return chosen
    for _ in range(MAX_NEW_ID_TRIES):
        new = ctx.new_id(prefix)
        if new not in taken:
            return new
    raise CommandError("conflict", "could not draw an unused id; send the command again")


def create(state: MayorState, cmd: BeadCreate, ctx: DecideContext) -> Accepted[BeadResult]:
    if ctx.actor.startswith(TOWN_AGENT_PREFIX) and cmd.type not in WORK_TYPES:
        # Plumbing (a message bead is mail, whose sender its metadata names) is made by the commands that own it:
        # the mayor agent's mail goes through mail.send, as itself.
        raise CommandError(
            "unauthorized", f"{ctx.actor} files work beads only ({', '.join(WORK_TYPES)}), not {cmd.type[:40]!r}"
        )
    if cmd.parent is not None:
        get_bead(state, cmd.parent, field="parent")
    for need in cmd.needs:
        get_bead(state, need, field="needs")
    bead_id = fresh_id(ctx, cmd.prefix, state.beads, cmd.new_id)
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
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=0)], result=BeadResult(id=bead_id, status="open", changed=True)
    )


def update(state: MayorState, cmd: BeadUpdate) -> Accepted[BeadResult]:
    bead = get_bead(state, cmd.id)
    target_status = _check_status(bead, cmd.status)
    changes = _field_changes(state, bead, cmd)
    add_labels = [label for label in dict.fromkeys(cmd.labels) if label not in bead.labels]
    remove_labels = [label for label in dict.fromkeys(cmd.remove_labels) if label in bead.labels or label in add_labels]
    metadata = {k: v for k, v in cmd.metadata.items() if bead.metadata.get(k) != v}
    remove_needs = [need for need in dict.fromkeys(cmd.remove_needs) if need in bead.needs]
    add_needs: list[str] = []
    for need in dict.fromkeys(cmd.needs):
        if need in bead.needs and need not in remove_needs:
            continue
        get_bead(state, need, field="needs")
        if need == bead.id or depends_on(state, need, bead.id):
            raise CommandError("invalid", f"`needs` {need!r} would close a dependency cycle through {bead.id!r}")
        add_needs.append(need)

    events: list[NewEvent] = []
    if changes or add_labels or remove_labels or metadata or add_needs or remove_needs:
        update_event = BeadUpdated(
            bead_id=bead.id,
            add_labels=add_labels,
            remove_labels=remove_labels,
            metadata=metadata,
            add_needs=add_needs,
            remove_needs=remove_needs,
            **changes,
        )
        events.append(NewEvent(payload=update_event, expected_seq=bead.version))
    events += _blocks(state, bead, cmd.blocks, add_needs)
    status = bead.status
    first = not any(e.payload.aggregate_id() == bead.id for e in events)
    if target_status == "in_progress" and bead.status != "in_progress":
        assignee = changes.get("assignee", bead.assignee)
        if not assignee:
            raise CommandError("invalid", "moving a bead to in_progress needs an `assignee`")
        events += claim(state, bead, assignee, first=first).events
        status = "in_progress"
    elif target_status == "closed" and bead.status != "closed":
        events += close(state, bead, "", first=first).events
        status = "closed"
    return Accepted(events=events, result=BeadResult(id=bead.id, status=status, changed=bool(events)))


def _field_changes(state: MayorState, bead: Bead, cmd: BeadUpdate) -> dict[str, Any]:
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
            get_bead(state, parent, field="parent")
            if is_ancestor(state, bead.id, parent):
                raise CommandError("invalid", f"`parent` {parent!r} would make {bead.id!r} its own ancestor")
        if parent != bead.parent:
            changes["parent"] = parent
    return changes


def _blocks(state: MayorState, bead: Bead, blocked_ids: list[str], own_new_needs: list[str]) -> list[NewEvent]:
    """Make each listed bead need ``bead``: events on their subjects."""
    events = []
    for blocked_id in dict.fromkeys(blocked_ids):
        blocked = get_bead(state, blocked_id, field="blocks")
        if bead.id in blocked.needs:
            continue
        closes_cycle = blocked_id == bead.id or depends_on(state, bead.id, blocked_id) or blocked_id in own_new_needs
        if closes_cycle:
            raise CommandError("invalid", f"`blocks` {blocked_id!r} would close a dependency cycle through {bead.id!r}")
        events.append(
            NewEvent(payload=BeadUpdated(bead_id=blocked_id, add_needs=[bead.id]), expected_seq=blocked.version)
        )
    return events


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
        raise CommandError("invalid", f"a bead becomes hooked by slinging it to a rig ({BeadSling.SUBJECT})")
    return status


def claim(state: MayorState, bead: Bead, assignee: str, *, first: bool = True) -> Accepted[BeadResult]:
    if bead.status == "closed":
        raise CommandError("backward_transition", f"bead {bead.id} is closed; it cannot be claimed again")
    if bead.status == "in_progress":
        if bead.assignee == assignee:
            return Accepted(result=BeadResult(id=bead.id, status=bead.status, changed=False, assignee=assignee))
        raise CommandError("conflict", f"bead {bead.id} is already in progress for {bead.assignee!r}")
    event = BeadClaimed(bead_id=bead.id, assignee=assignee)
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=bead.version if first else None)],
        result=BeadResult(id=bead.id, status="in_progress", changed=True, assignee=assignee),
    )


def close(state: MayorState, bead: Bead, reason: str, *, first: bool = True) -> Accepted[BeadResult]:
    if bead.status == "closed":
        return Accepted(result=BeadResult(id=bead.id, status="closed", changed=False))
    event = BeadClosed(bead_id=bead.id, reason=reason)
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=bead.version if first else None)],
        result=BeadResult(id=bead.id, status="closed", changed=True),
    )
