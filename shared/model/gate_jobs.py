"""Gate jobs as the refinery and the runners see them (``shared.model.events.gate_jobs``): the record and its fold.
Both services fold the same events the same way, so a runner's view of who runs what is the refinery's."""

from __future__ import annotations

import hashlib
from datetime import datetime

import msgspec

from shared.core import subjects
from shared.model.events.base import Envelope
from shared.model.events.gate_jobs import (
    GateCommand,
    GateJobCancelled,
    GateJobEvent,
    GateJobFinished,
    GateJobHeartbeat,
    GateJobRequested,
    GateJobStarted,
    GateJobStatus,
    GateResult,
)
from shared.model.fold import touch

RUNNER_SCOPE_PREFIX = subjects.runner_scope("")
"""A gate runner's service scope is ``runner-<name>``: its name in ``gate.started`` and the jobs' other events, and
its heartbeats' service in ``GT_SERVICES``."""
KEEP_FINISHED = 500
"""Finished and cancelled jobs a projection keeps (the newest); older ones are dropped as the next one finishes,
the same way by every reader of the log."""


class GateJob(msgspec.Struct, kw_only=True, gc=False):
    id: str
    rig: str
    repo: str
    target: str
    base: str
    commit: str
    ref: str
    stack: list[str] = []
    key: str
    gates: list[GateCommand] = []
    env: list[str] = []
    timeout_s: float
    pristine: bool = False
    requester: str
    requested_at: datetime
    status: GateJobStatus = "requested"
    runner: str = ""
    attempt: int = 0
    """Times a runner took it."""
    started_at: datetime | None = None
    heartbeat_at: datetime | None = None
    """The runner's last sign of life: its start or its newest heartbeat."""
    gate: str = ""
    """The gate running now."""
    ended_at: datetime | None = None
    passed: bool = False
    results: list[GateResult] = []
    error: str = ""
    """Why the gates could not run (``GateJobFinished.error``)."""
    reason: str = ""
    """Why it was cancelled."""
    version: int = 0

    @property
    def failure(self) -> GateResult | None:
        """The gate that failed, once finished and not passed."""
        failed = [r for r in self.results if r.exit_code != 0]
        return failed[0] if failed else None


def fold_gate_job(payload: GateJobEvent, jobs: dict[str, GateJob], env: Envelope, seq: int) -> None:
    """Fold a gate job event stored at ``seq`` into ``jobs``. A finished or cancelled job stays so; a late start or
    heartbeat (its runner lost the race to the log) moves only its version."""
    if isinstance(payload, GateJobRequested):
        jobs.setdefault(
            payload.job_id,
            GateJob(
                id=payload.job_id,
                rig=payload.rig,
                repo=payload.repo,
                target=payload.target,
                base=payload.base,
                commit=payload.commit,
                ref=payload.ref,
                stack=list(payload.stack),
                key=payload.key,
                gates=list(payload.gates),
                env=list(payload.env),
                timeout_s=payload.timeout_s,
                pristine=payload.pristine,
                requester=payload.requester,
                requested_at=env.ts,
                version=seq,
            ),
        )
        return
    job = touch(jobs, payload.job_id, seq)
    if job is None or job.status in ("finished", "cancelled"):
        return
    if isinstance(payload, GateJobStarted):
        job.status, job.runner, job.attempt = "running", payload.runner, payload.attempt
        job.started_at = job.heartbeat_at = env.ts
        job.gate = ""
    elif isinstance(payload, GateJobHeartbeat):
        if payload.runner == job.runner and payload.attempt == job.attempt:
            job.heartbeat_at, job.gate = env.ts, payload.gate
    elif isinstance(payload, GateJobFinished | GateJobCancelled):
        if isinstance(payload, GateJobFinished):
            job.status, job.passed, job.results = "finished", payload.passed, list(payload.results)
            job.error = payload.error
            job.runner, job.attempt = payload.runner, payload.attempt
        else:
            job.status, job.reason = "cancelled", payload.reason
        job.ended_at, job.gate = env.ts, ""
        _drop_oldest_ended(jobs)


def _drop_oldest_ended(jobs: dict[str, GateJob]) -> None:
    ended = [job for job in jobs.values() if job.status in ("finished", "cancelled")]
    if len(ended) > KEEP_FINISHED:
        ended.sort(key=lambda job: job.version)
        for job in ended[: len(ended) - KEEP_FINISHED]:
            del jobs[job.id]


def stack_key(rig: str, target: str, base: str, stack: list[tuple[str, str]], gates: list[GateCommand]) -> str:
    """The adoption key of a candidate: the rig, its target and the tip it stands on, each stacked merge request
    with the head it was stacked from, and the gates asked for."""
    parts = [rig, target, base, *(f"{mr}@{head}" for mr, head in stack), *(f"{g.gate}={g.command}" for g in gates)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


GATE_JOB_REFS = "refs/gt/gate/"
"""Where the refinery pushes each job's candidate in the rig's repository, for the runners to fetch by name."""


def job_ref(job_id: str) -> str:
    return f"{GATE_JOB_REFS}{job_id}"
