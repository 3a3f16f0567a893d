"""Which gate job a runner takes next, and the events it writes about it. Pure.

A runner takes the oldest job nobody runs yet, else the oldest one whose runner went quiet (no heartbeat for
``stale_s``), or one recorded as its own that it does not run (it was restarted under the same name). Every event
expects the job's last sequence (``GateJob.version``): a runner that lost a race, or its job, writes nothing."""

from __future__ import annotations

from datetime import datetime, timedelta

from services.runner.state import RunnerState
from shared.model.decision import NewEvent
from shared.model.events import GateJobFinished, GateJobHeartbeat, GateJobStarted
from shared.model.events.gate_jobs import GateResult
from shared.model.gate_jobs import GateJob


def quiet_since(job: GateJob) -> datetime:
    """The running job's runner's last sign of life."""
    return job.heartbeat_at or job.started_at or job.requested_at


def next_job(state: RunnerState, now: datetime, runner: str, stale_s: float, running: frozenset[str]) -> GateJob | None:
    """The job ``runner`` should take now (``running``: the jobs it runs), or None."""
    waiting = [job for job in state.jobs.values() if job.status == "requested"]
    if waiting:
        return min(waiting, key=lambda job: job.version)
    stale = timedelta(seconds=stale_s)
    abandoned = [
        job
        for job in state.jobs.values()
        if job.status == "running"
        and job.id not in running
        and (job.runner == runner or now - quiet_since(job) >= stale)
    ]
    return min(abandoned, key=lambda job: job.version) if abandoned else None


def stale_at(state: RunnerState, stale_s: float, running: frozenset[str]) -> datetime | None:
    """When the next job run by another runner goes stale (its runner quiet for ``stale_s``), if any runs."""
    times = [
        quiet_since(job) + timedelta(seconds=stale_s)
        for job in state.jobs.values()
        if job.status == "running" and job.id not in running
    ]
    return min(times, default=None)


def owns(job: GateJob | None, runner: str, attempt: int) -> bool:
    """Still this runner's to run: running, taken by ``runner`` at ``attempt``."""
    return job is not None and job.status == "running" and job.runner == runner and job.attempt == attempt


def take(job: GateJob, runner: str) -> NewEvent:
    return NewEvent(
        payload=GateJobStarted(job_id=job.id, runner=runner, attempt=job.attempt + 1), expected_seq=job.version
    )


def heartbeat(job: GateJob, runner: str, gate: str) -> NewEvent:
    return NewEvent(
        payload=GateJobHeartbeat(job_id=job.id, runner=runner, attempt=job.attempt, gate=gate),
        expected_seq=job.version,
    )


def finished(job: GateJob, runner: str, results: list[GateResult], error: str) -> NewEvent:
    passed = not error and all(result.exit_code == 0 for result in results)
    return NewEvent(
        payload=GateJobFinished(
            job_id=job.id, runner=runner, attempt=job.attempt, passed=passed, results=results, error=error
        ),
        expected_seq=job.version,
    )
