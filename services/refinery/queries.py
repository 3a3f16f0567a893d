"""Answers to ``gt.q.refinery.<name>``, a query decoded into its class (``shared.model.queries.refinery``), read from
the projection. Pure: the time and the queue's policy come in."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from services.refinery import plan
from services.refinery.state import RefineryState
from shared.core.errors import QueryError
from shared.model.queries import refinery
from shared.model.queries.base import Query


def answer(state: RefineryState, query: Query[Any], now: datetime, policy: plan.Policy) -> Any:
    match query:
        case refinery.Mrs(rig=rig):
            found = [m for m in state.mrs.values() if rig is None or m.rig == rig]
            found.sort(key=lambda m: (m.status not in ("queued", "claimed"), -plan.score(state, m, now, policy)))
            return found
        case refinery.Mr(id=mr_id):
            mr = state.mrs.get(mr_id)
            if mr is None:
                raise QueryError("not_found", f"no merge request {mr_id!r} (`gt mq list` shows them)")
            return mr
        case refinery.PausedQueues():
            return [
                refinery.PausedQueue(
                    rig=q.rig,
                    cause=q.cause,
                    reason=q.reason,
                    mr_id=q.mr_id,
                    detail=q.detail,
                    paused_at=q.paused_at.isoformat() if q.paused_at is not None else None,
                )
                for q in plan.paused_queues(state)
            ]
    raise QueryError("unknown_query", f"the refinery answers no {query.NAME!r}")
