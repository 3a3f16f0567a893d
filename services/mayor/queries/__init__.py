"""Answers to ``gt.q.mayor.<what>``, read from the projection. Pure: no I/O (formulas come in as a lookup)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import msgspec

from services.mayor.queries.costs import costs
from services.mayor.state import (
    STATUS_RANK,
    STATUSES,
    Bead,
    Convoy,
    Escalation,
    MayorState,
    Molecule,
    convoy_progress,
    convoy_waves,
    current_step,
    dependents,
    is_complete,
    is_message,
    is_read,
    is_ready,
    open_blockers,
)
from shared.commands import SEVERITIES
from shared.commands.mail import normalise_address, polecat_address
from shared.errors import QueryError
from shared.queries.base import DEFAULT_LIST_LIMIT, PAGE_BYTES, Page

T = TypeVar("T")
_ENCODER = msgspec.json.Encoder()

Sees = Callable[[Bead], bool]
"""Whether the asker may see a bead: every bead, except mail, which a polecat session sees only when it is to or
from its own polecat (``mail_visible_to``)."""


def everything(_bead: Bead) -> bool:
    return True


def bead_view(bead: Bead) -> dict[str, Any]:
    """A bead as queries return it (JSON-ready)."""
    view: dict[str, Any] = msgspec.to_builtins(bead)
    return view


def molecule_view(molecule: Molecule) -> dict[str, Any]:
    view: dict[str, Any] = msgspec.to_builtins(molecule)
    step = current_step(molecule)
    done = sum(1 for s in molecule.steps if s.status == "done")
    view.update(
        current_step=step.id if step else None, done=done, total=len(molecule.steps), complete=is_complete(molecule)
    )
    return view


def convoy_view(
    state: MayorState, convoy: Convoy, *, with_beads: bool = False, sees: Sees = everything
) -> dict[str, Any]:
    view: dict[str, Any] = msgspec.to_builtins(convoy)
    closed, total = convoy_progress(state, convoy)
    view.update(closed=closed, total=total)
    if with_beads:
        waves = convoy_waves(state, convoy)
        view["bead_details"] = [
            _dispatch_view(state, b, waves[bead_id])
            for bead_id in convoy.beads
            if (b := state.beads.get(bead_id)) and sees(b)
        ]
        view["held"] = sum(1 for bead_id in convoy.beads if bead_id in state.holds)
    return view


def _dispatch_view(state: MayorState, bead: Bead, wave: int) -> dict[str, Any]:
    """A convoy's bead: where it is, its wave, and (while open) what it waits for and the rig it is held for."""
    hold = state.holds.get(bead.id)
    return {
        "id": bead.id,
        "title": bead.title,
        "status": bead.status,
        "rig": bead.rig,
        "wave": wave,
        "waiting_for": open_blockers(state, bead) if bead.status == "open" else [],
        "held_for": hold.rig if hold is not None else None,
    }


def escalation_view(escalation: Escalation) -> dict[str, Any]:
    view: dict[str, Any] = msgspec.to_builtins(escalation)
    return view


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise QueryError("invalid", f"`{key}` must be a string")
    return value


def _required(body: dict[str, Any], key: str = "id") -> str:
    value = _opt_str(body, key)
    if not value:
        raise QueryError("invalid", f"`{key}` is required")
    return value


def _limit(body: dict[str, Any]) -> int:
    limit = body.get("limit", DEFAULT_LIST_LIMIT)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise QueryError("invalid", "`limit` must be a non-negative integer (0 = no limit)")
    return limit


def _take(
    items: Iterable[T], body: dict[str, Any], view: Callable[[T], dict[str, Any]], keep: Callable[[T], bool]
) -> Page:
    """A page of the list ``items`` (every item, in the list's order: the cursor is found among them whether or
    not it is still kept, so a bead that stopped matching between pages does not lose the place): the items after
    ``after`` that ``keep`` keeps, at most ``limit`` of them and ``page_bytes`` of their encoded ``view``s (the
    query server sets it to what one reply carries); ``next`` when more are kept."""
    after = _opt_str(body, "after")
    limit = _limit(body)
    room = body.get(PAGE_BYTES)
    if room is not None and (not isinstance(room, int) or isinstance(room, bool) or room <= 0):
        raise QueryError("invalid", f"`{PAGE_BYTES}` must be a positive integer")
    rest = iter(items)
    if after is not None:
        for item in rest:
            if _id_of(item) == after:
                break
        else:
            raise QueryError(
                "stale_cursor", f"`after` names {after!r}, no longer in the list (removed): list from the start"
            )
    out: list[dict[str, Any]] = []
    last: T | None = None
    for item in rest:
        if not keep(item):
            continue
        if limit and len(out) >= limit:
            return Page(items=out, next=_id_of(last))
        shown = view(item)
        if room is not None:
            room -= len(_ENCODER.encode(shown)) + 1
            if room < 0 and out:
                return Page(items=out, next=_id_of(last))
        out.append(shown)
        last = item
    return Page(items=out)


def _id_of(item: Any) -> str:
    ident: str = item.id
    return ident


def _bead(state: MayorState, body: dict[str, Any], sees: Sees, key: str = "id") -> Bead:
    bead_id = _required(body, key)
    bead = state.beads.get(bead_id)
    if bead is None:
        raise QueryError("not_found", f"no bead {bead_id!r}")
    if not sees(bead):
        raise QueryError(
            "unauthorized",
            f"{bead.id} is mail neither to nor from the asking session's polecat: a session reads only its own mail",
        )
    return bead


# ---- beads -------------------------------------------------------------------------------------


def _get(state: MayorState, body: dict[str, Any], sees: Sees) -> Any:
    bead = _bead(state, body, sees)
    view = bead_view(bead)
    if (hold := state.holds.get(bead.id)) is not None:
        view["hold"] = {**msgspec.to_builtins(hold), "waiting_for": open_blockers(state, bead)}
    return view


def _list(state: MayorState, body: dict[str, Any], sees: Sees) -> Any:
    matches = _bead_filter(body)
    return _take(state.beads.values(), body, bead_view, lambda b: matches(b) and sees(b))


def _ready(state: MayorState, body: dict[str, Any], sees: Sees) -> Any:
    return _take(state.beads.values(), body, bead_view, lambda b: is_ready(state, b) and sees(b))


def _children(state: MayorState, body: dict[str, Any], sees: Sees) -> Any:
    parent = _required(body)
    if parent in state.beads:
        _bead(state, body, sees)  # its children are not a way to learn of a message it may not see
    include_closed = bool(body.get("include_closed"))
    kids = (state.beads[c] for c in state.children.get(parent, ()) if c in state.beads)
    return [bead_view(b) for b in kids if (include_closed or b.status != "closed") and sees(b)]


def _deps(state: MayorState, body: dict[str, Any], sees: Sees) -> Any:
    """``down`` (default): what the bead needs; ``up``: what needs the bead."""
    bead = _bead(state, body, sees)
    direction = body.get("direction", "down") or "down"
    if direction not in ("down", "up"):
        raise QueryError("invalid", "`direction` must be down (what it needs) or up (what needs it)")
    ids = bead.needs if direction == "down" else dependents(state, bead.id)
    found = ((other, state.beads.get(other)) for other in ids)
    return [
        {"id": other, "status": b.status if b else None, "exists": b is not None}
        for other, b in found
        if b is None or sees(b)
    ]


def _bead_filter(body: dict[str, Any]) -> Callable[[Bead], bool]:
    """Whether a bead matches every filter of a ``list`` query's ``body`` (checked here, before any bead is)."""
    status = _opt_str(body, "status")
    if status is not None and status not in STATUS_RANK:
        raise QueryError("invalid", f"`status` must be one of {', '.join(STATUSES)}")
    type_ = _opt_str(body, "type")
    label = _opt_str(body, "label")
    assignee = _opt_str(body, "assignee")
    parent = _opt_str(body, "parent")
    rig = _opt_str(body, "rig")
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise QueryError("invalid", "`metadata` must be an object of strings (every pair must match)")
    include_closed = bool(body.get("include_closed")) or status == "closed"

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


# ---- molecules and convoys ---------------------------------------------------------------------


def _molecule(state: MayorState, body: dict[str, Any], sees: Sees) -> Any:
    bead = _bead(state, body, sees, "bead")
    molecule = state.molecules.get(bead.id)
    if molecule is None and bead.collected_molecule is not None:
        raise QueryError(
            "not_found",
            f"bead {bead.id} is closed and its {bead.collected_molecule} molecule was garbage-collected "
            f"(`gt bead history {bead.id}` shows its steps from the log)",
        )
    if molecule is None:
        raise QueryError("not_found", f"bead {bead.id} has no molecule")
    view = molecule_view(molecule)
    view["bead_status"] = bead.status
    view["rig"] = bead.rig
    return view


def _convoy(state: MayorState, body: dict[str, Any], sees: Sees) -> Any:
    convoy_id = _required(body)
    convoy = state.convoys.get(convoy_id)
    if convoy is None:
        raise QueryError("not_found", f"no convoy {convoy_id!r}")
    return convoy_view(state, convoy, with_beads=True, sees=sees)


def _convoys(state: MayorState, body: dict[str, Any], sees: Sees) -> Any:
    include_closed = bool(body.get("include_closed"))
    return _take(
        state.convoys.values(), body, lambda c: convoy_view(state, c), lambda c: include_closed or c.status == "open"
    )


# ---- mail and escalations ----------------------------------------------------------------------


def _inbox(state: MayorState, body: dict[str, Any], sees: Sees) -> Any:
    """Open messages to ``to``; unread ones only unless ``include_read``."""
    to = _required(body, "to")
    include_read = bool(body.get("include_read"))

    def listed(b: Bead) -> bool:
        unread = include_read or not is_read(b)
        return is_message(b) and b.assignee == to and b.status == "open" and unread and sees(b)

    return _take(state.beads.values(), body, bead_view, listed)


def _thread(state: MayorState, body: dict[str, Any], sees: Sees) -> Any:
    thread = _required(body, "thread")
    return [
        bead_view(b) for b in state.beads.values() if is_message(b) and b.metadata.get("thread") == thread and sees(b)
    ]


def _escalations(state: MayorState, body: dict[str, Any], sees: Sees) -> Any:
    """Open and acknowledged escalations, most severe first (closed ones too with ``include_closed``)."""
    include_closed = bool(body.get("include_closed"))
    ordered = sorted(state.escalations.values(), key=lambda e: (-SEVERITIES.index(e.severity), e.raised_at))
    return _take(ordered, body, escalation_view, lambda e: include_closed or e.status != "closed")


def _costs(state: MayorState, body: dict[str, Any], sees: Sees) -> Any:
    """Token usage grouped ``by`` bead, rig, convoy, day or session (``services.mayor.queries.costs``)."""
    convoys_of_bead: dict[str, list[str]] = {}
    for convoy in state.convoys.values():
        for bead_id in convoy.beads:
            convoys_of_bead.setdefault(bead_id, []).append(convoy.id)
    return costs(state.usage, _opt_str(body, "by") or "bead", convoys_of_bead)


QUERIES: dict[str, Callable[[MayorState, dict[str, Any], Sees], Any]] = {
    "get": _get,
    "list": _list,
    "ready": _ready,
    "children": _children,
    "deps": _deps,
    "molecule": _molecule,
    "convoy": _convoy,
    "convoys": _convoys,
    "inbox": _inbox,
    "thread": _thread,
    "escalations": _escalations,
    "costs": _costs,
}


def check_session_query(state: MayorState, what: str, body: dict[str, Any], session: str) -> None:
    """A polecat session reads only its own polecat's mail: ``inbox`` of its own address, ``thread`` of messages
    it sent or received. Raises ``QueryError`` ``unauthorized`` otherwise. (Answering with ``mail_visible_to``
    then leaves others' mail out of every list and refuses a query about one message of others.)"""
    if what not in ("inbox", "thread"):
        return
    own = session_address(state, session)
    if own is None:
        raise QueryError("unauthorized", f"session {session} is no live polecat session; it reads no mail")
    if what == "inbox" and normalise_address(str(body.get("to") or "")) != own:
        raise QueryError("unauthorized", f"session {session} reads only its own inbox ({own})")
    if what == "thread":
        thread = body.get("thread")
        for bead in state.beads.values():
            if is_message(bead) and bead.metadata.get("thread") == thread and not _visible(bead, own):
                raise QueryError("unauthorized", f"thread {thread} holds mail {own} neither sent nor received")


def mail_visible_to(state: MayorState, session: str) -> Sees:
    """What polecat session ``session`` may see: every bead but mail neither to nor from its polecat (no mail at
    all once the session is no longer live)."""
    own = session_address(state, session)
    return lambda bead: _visible(bead, own)


def _visible(bead: Bead, own: str | None) -> bool:
    return not is_message(bead) or (own is not None and own in (bead.assignee, bead.metadata.get("from")))


def session_address(state: MayorState, session: str) -> str | None:
    """The mail address of the polecat a live session works as."""
    for rig in state.rigs.values():
        for polecat, current in rig.polecats.items():
            if current == session:
                return polecat_address(rig.name, polecat)
    return None


def answer(state: MayorState, what: str, body: dict[str, Any], *, sees: Sees = everything) -> Any:
    """Answer one query, leaving out what the asker may not ``sees``; raises ``QueryError`` for a bad query or
    something missing."""
    handler = QUERIES.get(what)
    if handler is None:
        known = ", ".join([*QUERIES, "formulas", "formula", "status", "digest"])
        raise QueryError("unknown_query", f"the mayor has no query {what!r}; it answers {known}")
    return handler(state, body, sees)
