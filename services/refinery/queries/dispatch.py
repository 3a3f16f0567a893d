"""Answers to ``gt.q.refinery.<name>``, a query decoded into its class (``shared.model.queries.refinery``), read from
the projection. Pure: the time, the queue's policy and (for the board) the runners' heartbeats come in."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from services.refinery import plan
from services.refinery.queries.board import Live, board
from services.refinery.state import RefineryState
from shared.core.errors import QueryError
from shared.model.queries import refinery
from shared.model.queries.base import Query


def answer(
    state: RefineryState, query: Query[Any], now: datetime, policy: plan.Policy, live: Live | None = None
) -> Any:
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
        case refinery.Board(rig=rig):
            if rig is not None and rig not in state.rigs and all(m.rig != rig for m in state.merges):
                raise QueryError("not_found", f"no rig {rig!r} (`gt rig list` shows them)")
            return board(state, now, live or Live(), rig)
    raise QueryError("unknown_query", f"the refinery answers no {query.NAME!r}")
