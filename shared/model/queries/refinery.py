"""Queries the refinery answers (``gt.q.refinery.<name>``): its merge queue, and its board (runners, gate jobs,
merges per hour)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal

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


RunnerState = Literal["up", "standby", "stopped", "down", "gone"]
"""What a runner's service heartbeats say: up (a fresh beat of the active process), standby (only a process waiting
to take over beats: nothing runs jobs), stopped (its last beat was the goodbye of a clean stop), down (its beats
stopped, older than the stale limit), gone (known from the log's jobs, no beat in ``GT_SERVICES``: its last one is
over an hour old)."""


class RunnerView(msgspec.Struct, kw_only=True):
    """A gate runner (``gt-runner``): whether it is alive, from its service heartbeats in ``GT_SERVICES``; the job
    it runs now, from the log; and the jobs it finished, as the log records them."""

    name: str
    """Its service scope, ``runner-<name>``: how jobs and heartbeats name it."""
    state: RunnerState
    alive: bool
    """Up: it takes and runs jobs."""
    host: str = ""
    instance: str = ""
    """The process of its newest heartbeat."""
    last_beat: datetime | None = None
    beat_age_s: float | None = None
    """Seconds from its newest heartbeat to the answer (``MqBoard.at``)."""
    job: str = ""
    """The job the log says it runs now ("" when none)."""
    rig: str = ""
    gate: str = ""
    """That job's gate running now, as its last heartbeat in the log named it."""
    job_running_s: float | None = None
    jobs_run: int = 0
    """Jobs it finished (``gate.finished`` by it: the gates ran, or could not)."""
    jobs_passed: int = 0
    gate_seconds: float = 0.0
    """The time of the gates it ran in those jobs."""
    last_finished_at: datetime | None = None


class StackedMr(msgspec.Struct, kw_only=True):
    """A merge request stacked in a gate job's candidate, and its bead ("" once the refinery forgot it)."""

    id: str
    bead: str = ""


class JobView(msgspec.Struct, kw_only=True):
    """A gate job not ended yet: running on a runner, or waiting for one to take it."""

    id: str
    rig: str
    target: str
    status: Literal["requested", "running"]
    stack: list[StackedMr] = []
    """The merge requests its candidate carries, in stack order (empty: the target's tip itself)."""
    commit: str
    runner: str = ""
    attempt: int = 0
    """Times a runner took it (above 1: a runner before went quiet)."""
    gate: str = ""
    """The gate running now, as the runner's last heartbeat in the log named it ("" until one does)."""
    requested_at: datetime
    started_at: datetime | None = None
    waited_s: float
    """Seconds from its request to its (last) start, or to the answer while it waits."""
    running_s: float | None = None
    """Seconds since its runner took it."""
    quiet_s: float | None = None
    """Seconds since its runner's last sign of life in the log (a start or a job heartbeat)."""


class MergeWindow(msgspec.Struct, kw_only=True):
    """Merges over the last ``hours`` (by the minutes of the log's time they were recorded in, the answer's minute
    among them)."""

    hours: int
    merged: int = 0
    """Merge requests merged."""
    per_hour: float = 0.0
    """``merged`` / ``hours``."""
    batches: int = 0
    """Batches that merged them (with runners or batching, several merge requests land with one push)."""
    gate_seconds: float = 0.0
    """The gate time of those batches, each batch's once: every gate it ran, the culprits taken out and the checks
    on the target included."""
    gate_minutes_per_merge: float | None = None
    """``gate_seconds`` / 60 / ``merged``: gate time spent for each merge request merged (None: none merged)."""


class MergeFigures(msgspec.Struct, kw_only=True):
    """Merges per hour and gate minutes per merge, of one rig or of all (``rig`` "")."""

    rig: str = ""
    last_hour: MergeWindow
    last_day: MergeWindow
    """The last 24 hours."""


class MqBoard(msgspec.Struct, kw_only=True):
    """The merge queue's gates at a glance (``gt mq runners``, the dashboard): the gate runners, the gate jobs
    running and waiting with the merge requests they carry, and the merge figures."""

    at: datetime
    """When the refinery answered (the ages and windows count to here)."""
    runners_used: int = 0
    """``GT_MQ_RUNNERS``: candidates gated at once on runners (0: the refinery gates them itself)."""
    runners: list[RunnerView] = []
    """By name."""
    running: list[JobView] = []
    """Oldest first."""
    waiting: list[JobView] = []
    """Waiting for a runner to take them, oldest first."""
    merges: MergeFigures
    """Of the rig asked, or of every rig."""
    rigs: list[MergeFigures] = []
    """Of each rig that merged in the last 24 hours, by rig (without a rig asked)."""


class Board(RefineryQuery[MqBoard], frozen=True, kw_only=True):
    """The gate runners, the gate jobs running and waiting, merges per hour and gate minutes per merge; of one rig's
    jobs and merges when given (the runners serve every rig: all are listed)."""

    NAME: ClassVar[str] = "board"
    rig: str | None = None


QUERIES: tuple[type[Query[Any]], ...] = (Mrs, Mr, PausedQueues, Board)
"""What the refinery answers (besides ``status`` and ``digest``)."""
