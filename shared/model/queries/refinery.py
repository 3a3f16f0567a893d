"""Queries the refinery answers (``gt.q.refinery.<name>``): its merge queue."""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from shared.model.merge_requests import MergeRequest
from shared.model.queries.base import Query, R, Required, ServiceStatus


class RefineryQuery(Query[R], frozen=True, kw_only=True):
    """A query the refinery answers (``gt.q.refinery.<name>``)."""

    SERVICE: ClassVar[str] = "refinery"


class RefineryStatus(ServiceStatus, kw_only=True):
    """The refinery's ``status``: what its merges came to, its gates, and the merge requests it works on now."""

    merged: int = 0
    failed: int = 0
    conflicted: int = 0
    gate_runs: int = 0
    gate_seconds: float = 0.0
    batches: int = 0
    fenced: int = 0
    batch_size: int = 0
    processing: list[str] = []


class Mrs(RefineryQuery[list[MergeRequest]], frozen=True, kw_only=True):
    """The merge queue (of one rig when given): waiting ones first, by score."""

    NAME: ClassVar[str] = "mrs"
    rig: str | None = None


class Mr(RefineryQuery[MergeRequest], frozen=True, kw_only=True):
    NAME: ClassVar[str] = "mr"
    id: Required


class PausedQueue(msgspec.Struct, kw_only=True):
    """A rig's merge queue that is paused: why, and the merge request that met the cause."""

    rig: str
    cause: str
    reason: str
    mr_id: str
    detail: str = ""
    paused_at: str | None = None


class PausedQueues(RefineryQuery[list[PausedQueue]], frozen=True, kw_only=True):
    """The rigs' merge queues that are paused now (``gt mq resume <rig>`` resumes one), by rig."""

    NAME: ClassVar[str] = "paused"


QUERIES: tuple[type[Query[Any]], ...] = (Mrs, Mr, PausedQueues)
"""What the refinery answers (besides ``status`` and ``digest``)."""
