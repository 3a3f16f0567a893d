"""Answers to ``gt.q.refinery.<what>``, read from the projection. Pure: the time and the queue's policy come in."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from services.refinery import plan
from services.refinery.decide import mr_view
from services.refinery.state import RefineryState
from shared.errors import QueryError


def answer(state: RefineryState, what: str, body: dict[str, Any], now: datetime, policy: plan.Policy) -> Any:
    if what == "mrs":
        rig = body.get("rig")
        if rig is not None and not isinstance(rig, str):
            raise QueryError("invalid", "`rig` must be a string")
        found = [m for m in state.mrs.values() if rig is None or m.rig == rig]
        found.sort(key=lambda m: (m.status not in ("queued", "claimed"), -plan.score(state, m, now, policy)))
        return [mr_view(m) for m in found]
    if what == "mr":
        mr_id = body.get("id")
        if not isinstance(mr_id, str) or not mr_id:
            raise QueryError("invalid", "`id` is required")
        mr = state.mrs.get(mr_id)
        if mr is None:
            raise QueryError("not_found", f"no merge request {mr_id!r} (`gt mq list` shows them)")
        return mr_view(mr)
    if what == "paused":
        return [
            {
                "rig": q.rig,
                "cause": q.cause,
                "reason": q.reason,
                "mr_id": q.mr_id,
                "detail": q.detail,
                "paused_at": q.paused_at.isoformat() if q.paused_at is not None else None,
            }
            for q in plan.paused_queues(state)
        ]
    raise QueryError("unknown_query", f"the refinery has no query {what!r}; it answers mrs, mr, paused, status, digest")
