"""Answers to ``gt.q.mayor.<what>``, read from the projection. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from services.mayor.projection import STATUS_RANK, STATUSES, Bead, MayorState, is_ready
from shared.errors import QueryError

DEFAULT_LIST_LIMIT = 1000
QUERIES = ("get", "list", "ready", "children")


def bead_view(bead: Bead) -> dict[str, Any]:
    """A bead as queries return it (JSON-ready)."""
    view: dict[str, Any] = msgspec.to_builtins(bead)
    return view


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise QueryError("invalid", f"`{key}` must be a string")
    return value


def _required_id(body: dict[str, Any]) -> str:
    bead_id = _opt_str(body, "id")
    if not bead_id:
        raise QueryError("invalid", "`id` is required")
    return bead_id


def _limit(body: dict[str, Any]) -> int:
    limit = body.get("limit", DEFAULT_LIST_LIMIT)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise QueryError("invalid", "`limit` must be a non-negative integer (0 = no limit)")
    return limit


def _take(beads: Iterable[Bead], limit: int) -> list[dict[str, Any]]:
    out = []
    for bead in beads:
        out.append(bead_view(bead))
        if limit and len(out) >= limit:
            break
    return out


def answer(state: MayorState, what: str, body: dict[str, Any]) -> Any:
    """Answer one query; raises ``QueryError`` for a bad query or a missing bead."""
    if what == "get":
        bead_id = _required_id(body)
        bead = state.beads.get(bead_id)
        if bead is None:
            raise QueryError("not_found", f"no bead {bead_id!r}")
        return bead_view(bead)
    if what == "list":
        return _take(_filtered(state, body), _limit(body))
    if what == "ready":
        return _take((b for b in state.beads.values() if is_ready(state, b)), _limit(body))
    if what == "children":
        parent = _required_id(body)
        include_closed = bool(body.get("include_closed"))
        kids = (state.beads[c] for c in state.children.get(parent, ()) if c in state.beads)
        return _take((b for b in kids if include_closed or b.status != "closed"), 0)
    raise QueryError("unknown_query", f"the mayor has no query {what!r}; it answers {', '.join(QUERIES)}, status")


def _filtered(state: MayorState, body: dict[str, Any]) -> Iterator[Bead]:
    status = _opt_str(body, "status")
    if status is not None and status not in STATUS_RANK:
        raise QueryError("invalid", f"`status` must be one of {', '.join(STATUSES)}")
    type_ = _opt_str(body, "type")
    label = _opt_str(body, "label")
    assignee = _opt_str(body, "assignee")
    parent = _opt_str(body, "parent")
    include_closed = bool(body.get("include_closed")) or status == "closed"
    for bead in state.beads.values():
        if bead.status == "closed" and not include_closed:
            continue
        if status is not None and bead.status != status:
            continue
        if type_ is not None and bead.type != type_:
            continue
        if label is not None and label not in bead.labels:
            continue
        if assignee is not None and bead.assignee != assignee:
            continue
        if parent is not None and bead.parent != parent:
            continue
        yield bead
