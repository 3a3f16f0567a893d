"""Token usage grouped per bead, rig, convoy, day or session for ``gt.q.mayor.costs``. Pure.

The usage book is folded by the projection (``fold_usage``): a ``session.usage`` event holds the session's running
totals, so the fold keeps the newest per session, and what a session used between two of its events (the
difference) is what the day of the later event used."""

from __future__ import annotations

from collections.abc import Iterable

from services.mayor.state import MayorState, SessionCost, UsageBook
from shared.core.errors import QueryError
from shared.model.usage import COST_GROUPINGS, CostRow, ModelUsage, merge

GROUPINGS = COST_GROUPINGS


def _row(key: str, usages: Iterable[ModelUsage], sessions: int) -> CostRow:
    models = merge({}, usages)
    return CostRow(key=key, sessions=sessions, models=[models[m] for m in sorted(models)])


def costs(book: UsageBook, by: str, convoys_of_bead: dict[str, list[str]]) -> list[CostRow]:
    """The rows sorted by key. ``convoys_of_bead``: bead -> the convoys
    tracking it (a bead in two convoys counts in both)."""
    if by not in GROUPINGS:
        raise QueryError("invalid", f"`by` must be one of {', '.join(GROUPINGS)}, got {by!r}")
    if by == "day":
        return [_row(day, models.values(), 0) for day, models in sorted(book.days.items())]
    groups: dict[str, list[SessionCost]] = {}
    for session_id, cost in book.sessions.items():
        if by == "session":
            keys = [session_id]
        elif by == "bead":
            keys = [cost.bead]
        elif by == "rig":
            keys = [cost.rig]
        else:
            keys = convoys_of_bead.get(cost.bead) or ["(none)"]
        for key in keys:
            groups.setdefault(key, []).append(cost)
    return [_row(key, (u for c in found for u in c.models), len(found)) for key, found in sorted(groups.items())]


def costs_of(state: MayorState, by: str | None) -> list[CostRow]:
    """``gt.q.mayor.costs``: the usage book grouped ``by`` bead (the default), rig, convoy, day or session."""
    convoys_of_bead: dict[str, list[str]] = {}
    for convoy in state.convoys.values():
        for bead_id in convoy.beads:
            convoys_of_bead.setdefault(bead_id, []).append(convoy.id)
    return costs(state.usage, by or "bead", convoys_of_bead)
