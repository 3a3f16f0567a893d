"""Answers to ``gt.q.refinery.<name>``, read from the projection. Pure: no I/O.

``answer`` dispatches a typed query (``dispatch.py``); ``board`` is the merge queue's board (runners, gate jobs,
merges per hour, gate minutes per merge), from the state, the runners' heartbeats (``Live``) and the time.
"""

from __future__ import annotations

from services.refinery.queries.board import Live, board, merge_figures, runner_views
from services.refinery.queries.dispatch import answer

__all__ = ["Live", "answer", "board", "merge_figures", "runner_views"]
