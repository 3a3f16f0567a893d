"""Answers about mail and escalations (``inbox``, ``thread``, ``escalations``), and what mail a polecat session may
read. Pure."""

from __future__ import annotations

from typing import Any

from services.mayor.queries.pages import take
from services.mayor.queries.views import Sees
from services.mayor.state import Bead, MayorState, is_message, is_read
from shared.core.errors import QueryError
from shared.model.commands import SEVERITIES
from shared.model.commands.mail import normalise_address, polecat_address
from shared.model.queries import mayor
from shared.model.queries.base import Page, Query


def inbox(state: MayorState, query: mayor.Inbox, sees: Sees) -> Page:
    """Open messages to ``to``; unread ones only unless ``include_read``."""

    def listed(b: Bead) -> bool:
        unread = query.include_read or not is_read(b)
        return is_message(b) and b.assignee == query.to and b.status == "open" and unread and sees(b)

    return take(
        state.beads.values(),
        limit=query.limit,
        after=query.after,
        page_bytes=query.page_bytes,
        keep=listed,
    )


def thread(state: MayorState, query: mayor.Thread, sees: Sees) -> list[Bead]:
    return [b for b in state.beads.values() if is_message(b) and b.metadata.get("thread") == query.thread and sees(b)]


def escalations(state: MayorState, query: mayor.Escalations) -> Page:
    """Open and acknowledged escalations, most severe first (closed ones too with ``include_closed``)."""
    ordered = sorted(state.escalations.values(), key=lambda e: (-SEVERITIES.index(e.severity), e.raised_at))
    return take(
        ordered,
        limit=query.limit,
        after=query.after,
        page_bytes=query.page_bytes,
        keep=lambda e: query.include_closed or e.status != "closed",
    )


def check_session_query(state: MayorState, query: Query[Any], session: str) -> None:
    """A polecat session reads only its own polecat's mail: ``inbox`` of its own address, ``thread`` of messages
    it sent or received. Raises ``QueryError`` ``unauthorized`` otherwise. (Answering with ``mail_visible_to``
    then leaves others' mail out of every list and refuses a query about one message of others.)"""
    if not isinstance(query, mayor.Inbox | mayor.Thread):
        return
    own = session_address(state, session)
    if own is None:
        raise QueryError("unauthorized", f"session {session} is no live polecat session; it reads no mail")
    match query:
        case mayor.Inbox(to=to) if normalise_address(to) != own:
            raise QueryError("unauthorized", f"session {session} reads only its own inbox ({own})")
        case mayor.Thread(thread=name):
            for bead in state.beads.values():
                if is_message(bead) and bead.metadata.get("thread") == name and not _visible(bead, own):
                    raise QueryError("unauthorized", f"thread {name} holds mail {own} neither sent nor received")


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
