"""Answers about beads: ``get``, ``list``, ``ready``, ``children``, ``deps``. Pure."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from services.mayor.queries.pages import take
from services.mayor.queries.views import Sees
from services.mayor.state import STATUS_RANK, STATUSES, Bead, MayorState, dependents, is_ready, open_blockers
from shared.core.errors import QueryError
from shared.model.beads import BeadDetail, HoldView
from shared.model.queries import mayor
from shared.model.queries.base import Page


def find_bead(state: MayorState, bead_id: str, sees: Sees) -> Bead:
    """The bead ``bead_id``; ``not_found`` when there is none, ``unauthorized`` when the asker may not see it."""
    bead = state.beads.get(bead_id)
    if bead is None:
        raise QueryError("not_found", f"no bead {bead_id!r}")
    if not sees(bead):
        raise QueryError(
            "unauthorized",
            f"{bead.id} is mail neither to nor from the asking session's polecat: a session reads only its own mail",
        )
    return bead


def get(state: MayorState, query: mayor.Get, sees: Sees) -> Bead:
    """The bead's record; a ``BeadDetail`` with its hold while it is held."""
    bead = find_bead(state, query.id, sees)
    if (hold := state.holds.get(bead.id)) is None:
        return bead
    shown = HoldView(rig=hold.rig, blockers=hold.blockers, since=hold.since, waiting_for=open_blockers(state, bead))
    return BeadDetail(**msgspec.structs.asdict(bead), hold=shown)


def beads(state: MayorState, query: mayor.Beads, sees: Sees) -> Page:
    matches = bead_filter(query)
    return take(
        state.beads.values(),
        limit=query.limit,
        after=query.after,
        page_bytes=query.page_bytes,
        keep=lambda b: matches(b) and sees(b),
    )


def ready(state: MayorState, query: mayor.Ready, sees: Sees) -> Page:
    return take(
        state.beads.values(),
        limit=query.limit,
        after=query.after,
        page_bytes=query.page_bytes,
        keep=lambda b: is_ready(state, b) and sees(b),
    )


def children(state: MayorState, query: mayor.Children, sees: Sees) -> list[Bead]:
    parent = query.id
    if parent in state.beads:
        find_bead(state, parent, sees)  # its children are not a way to learn of a message it may not see
    kids = (state.beads[c] for c in state.children.get(parent, ()) if c in state.beads)
    return [b for b in kids if (query.include_closed or b.status != "closed") and sees(b)]


def deps(state: MayorState, query: mayor.Deps, sees: Sees) -> list[mayor.DepView]:
    """``down`` (default): what the bead needs; ``up``: what needs the bead."""
    bead = find_bead(state, query.id, sees)
    direction = query.direction or "down"
    if direction not in ("down", "up"):
        raise QueryError("invalid", "`direction` must be down (what it needs) or up (what needs it)")
    ids = bead.needs if direction == "down" else dependents(state, bead.id)
    found = ((other, state.beads.get(other)) for other in ids)
    return [
        mayor.DepView(id=other, status=b.status if b else None, exists=b is not None)
        for other, b in found
        if b is None or sees(b)
    ]


def bead_filter(query: mayor.Beads) -> Callable[[Bead], bool]:
    """Whether a bead matches every filter of a ``list`` query (checked here, before any bead is)."""
    status = query.status
    if status is not None and status not in STATUS_RANK:
        raise QueryError("invalid", f"`status` must be one of {', '.join(STATUSES)}")
    type_, label, assignee, parent, rig = query.type, query.label, query.assignee, query.parent, query.rig
    metadata = query.metadata
    include_closed = query.include_closed or status == "closed"

    def matches(bead: Bead) -> bool:
        return (
            (include_closed or bead.status != "closed")
            and (status is None or bead.status == status)
            and (type_ is None or bead.type == type_)
            and (label is None or label in bead.labels)
            and (assignee is None or bead.assignee == assignee)
            and (parent is None or bead.parent == parent)
            and (rig is None or bead.rig == rig)
            and not (metadata and any(bead.metadata.get(k) != v for k, v in metadata.items()))
        )

    return matches
