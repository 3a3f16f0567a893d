"""A list query's page (``limit``, ``after``, ``page_bytes``: ``shared.model.queries.base.Page``). Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import msgspec

from shared.core.errors import QueryError
from shared.model.queries.base import DEFAULT_LIST_LIMIT, Page

T = TypeVar("T")
_ENCODER = msgspec.json.Encoder()


def take(
    items: Iterable[T],
    *,
    limit: int | None,
    after: str | None,
    page_bytes: int | None,
    view: Callable[[T], object] | None = None,
    keep: Callable[[T], bool],
) -> Page:
    """A page of the list ``items`` (every item, in the list's order: the cursor is found among them whether or
    not it is still kept, so a bead that stopped matching between pages does not lose the place): the items after
    ``after`` that ``keep`` keeps, at most ``limit`` of them (None: ``DEFAULT_LIST_LIMIT``, 0: all) and
    ``page_bytes`` of their encoded ``view``s (the query server sets it to what one reply carries); ``next`` when
    more are kept. ``view`` None: the items as they are (a record that is its own answer)."""
    limit = DEFAULT_LIST_LIMIT if limit is None else limit
    room = page_bytes
    rest = iter(items)
    if after is not None:
        for item in rest:
            if _id_of(item) == after:
                break
        else:
            raise QueryError(
                "stale_cursor", f"`after` names {after!r}, no longer in the list (removed): list from the start"
            )
    out: list[object] = []
    last: T | None = None
    for item in rest:
        if not keep(item):
            continue
        if limit and len(out) >= limit:
            return Page(items=out, next=_id_of(last))
        shown = item if view is None else view(item)
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
