"""The merge queue's board (``gt.q.refinery.board``): the gate runners, the gate jobs running and waiting, merges per
hour and gate minutes per merge. Pure: the state, the runners' service heartbeats (``Live``) and the time come in.

- A runner is alive when the newest heartbeat of its scope (``runner-<name>``), from a process that acts, is at most
  ``Live.stale_s`` old: the deacon's rule for services (``GT_SERVICE_STALE_AFTER``). The job it runs is the log's.
- Merges are counted by the minute of the log's time they were recorded in (``RefineryState.merges``): a window
  of ``hours`` holds the answer's minute and the ones before it, ``hours * 60`` in all.
- Gate minutes per merge: the gate time of the batches that merged in the window, each batch's once (its merge
  requests share it), divided by the merge requests merged there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta

import msgspec

from services.refinery.state import MergeMinute, RefineryState, RunnerTally
from shared.model.events.gate_jobs import GATE_JOB_OPEN
from shared.model.gate_jobs import RUNNER_SCOPE_PREFIX, GateJob
from shared.model.heartbeats import ServiceHeartbeat
from shared.model.queries.refinery import (
    JobView,
    MergeFigures,
    MergeWindow,
    MqBoard,
    RunnerState,
    RunnerView,
    StackedMr,
)

LAST_HOUR = 1
LAST_DAY = 24


class Live(msgspec.Struct, frozen=True, kw_only=True):
    """What the board needs besides the projection: the runners' service heartbeats as ``GT_SERVICES`` holds them
    now, how old the newest may be for a runner to be up, and how many runners the refinery gates on."""

    beats: Sequence[ServiceHeartbeat] = ()
    stale_s: float = 3.0
    runners_used: int = 0


def board(state: RefineryState, now: datetime, live: Live, rig: str | None = None) -> MqBoard:
    """The board at ``now``: every runner, the jobs (of ``rig`` when given) and the merge figures (of ``rig``, or of
    all with each rig's beside)."""
    running, waiting = job_views(state, now, rig)
    rigs = sorted({m.rig for m in state.merges}) if rig is None else []
    return MqBoard(
        at=now,
        runners_used=live.runners_used,
        runners=runner_views(state.gate_jobs.values(), state.runners, live.beats, now, live.stale_s),
        running=running,
        waiting=waiting,
        merges=merge_figures(state.merges, now, rig),
        rigs=[f for f in (merge_figures(state.merges, now, r) for r in rigs) if f.last_day.merged],
    )


# ---- runners -------------------------------------------------------------------------------------------------------


def runner_views(
    jobs: Iterable[GateJob],
    tallies: Mapping[str, RunnerTally],
    beats: Iterable[ServiceHeartbeat],
    now: datetime,
    stale_s: float,
) -> list[RunnerView]:
    """Every runner that beats, runs a job or finished one, by name."""
    by_scope: dict[str, list[ServiceHeartbeat]] = {}
    for beat in beats:
        if beat.service.startswith(RUNNER_SCOPE_PREFIX):
            by_scope.setdefault(beat.service, []).append(beat)
    running: dict[str, GateJob] = {}
    for candidate in jobs:
        if candidate.status == "running" and candidate.runner:
            shown = running.get(candidate.runner)
            if shown is None or _started(candidate) > _started(shown):
                running[candidate.runner] = candidate
    views = []
    for name in sorted({*by_scope, *running, *tallies}):
        state, newest = runner_state(by_scope.get(name, []), now, stale_s)
        job = running.get(name)
        tally = tallies.get(name, RunnerTally())
        views.append(
            RunnerView(
                name=name,
                state=state,
                alive=state == "up",
                host=newest.host if newest is not None else "",
                instance=newest.instance if newest is not None else "",
                last_beat=newest.ts if newest is not None else None,
                beat_age_s=_seconds(now - newest.ts) if newest is not None else None,
                job=job.id if job is not None else "",
                rig=job.rig if job is not None else "",
                gate=job.gate if job is not None else "",
                job_running_s=_seconds(now - job.started_at) if job is not None and job.started_at else None,
                jobs_run=tally.jobs_run,
                jobs_passed=tally.jobs_passed,
                gate_seconds=round(tally.gate_seconds, 3),
                last_finished_at=tally.last_finished_at,
            )
        )
    return views


def runner_state(
    beats: Sequence[ServiceHeartbeat], now: datetime, stale_s: float
) -> tuple[RunnerState, ServiceHeartbeat | None]:
    """What a runner scope's heartbeats (of all its processes) say at ``now``, and the one its view shows: the
    acting process's freshest, else the newest of any."""
    if not beats:
        return "gone", None
    stale = timedelta(seconds=stale_s)
    fresh = sorted((b for b in beats if now - b.ts <= stale and not b.stopping), key=lambda b: b.ts, reverse=True)
    acting = [b for b in fresh if not b.standby]
    if acting:
        return "up", acting[0]
    if fresh:
        return "standby", fresh[0]
    newest = max(beats, key=lambda b: b.ts)
    return ("stopped" if newest.stopping else "down"), newest


# ---- jobs ----------------------------------------------------------------------------------------------------------


def job_views(state: RefineryState, now: datetime, rig: str | None = None) -> tuple[list[JobView], list[JobView]]:
    """The jobs running and those waiting for a runner (of ``rig`` when given), each oldest first."""
    open_jobs = sorted(
        (j for j in state.gate_jobs.values() if j.status in GATE_JOB_OPEN and (rig is None or j.rig == rig)),
        key=lambda j: j.version,
    )
    views = [job_view(state, job, now) for job in open_jobs]
    return [v for v in views if v.status == "running"], [v for v in views if v.status == "requested"]


def job_view(state: RefineryState, job: GateJob, now: datetime) -> JobView:
    running = job.status == "running"
    started = job.started_at if running else None
    quiet_since = job.heartbeat_at or job.started_at
    return JobView(
        id=job.id,
        rig=job.rig,
        target=job.target,
        status="running" if running else "requested",
        stack=[StackedMr(id=mr, bead=m.bead if (m := state.mrs.get(mr)) is not None else "") for mr in job.stack],
        commit=job.commit,
        runner=job.runner,
        attempt=job.attempt,
        gate=job.gate if running else "",
        requested_at=job.requested_at,
        started_at=started,
        waited_s=_seconds((started or now) - job.requested_at),
        running_s=_seconds(now - started) if started is not None else None,
        quiet_s=_seconds(now - quiet_since) if running and quiet_since is not None else None,
    )


# ---- merges --------------------------------------------------------------------------------------------------------


def merge_figures(minutes: Iterable[MergeMinute], now: datetime, rig: str | None = None) -> MergeFigures:
    """Merges per hour and gate minutes per merge over the last hour and the last 24 hours, of ``rig`` or all."""
    mine = [m for m in minutes if rig is None or m.rig == rig]
    return MergeFigures(
        rig=rig or "", last_hour=merge_window(mine, now, LAST_HOUR), last_day=merge_window(mine, now, LAST_DAY)
    )


def merge_window(minutes: Iterable[MergeMinute], now: datetime, hours: int) -> MergeWindow:
    """The merges recorded in the ``hours * 60`` minutes up to ``now``'s (that minute included)."""
    last = now.replace(second=0, microsecond=0)
    first = last - timedelta(minutes=hours * 60 - 1)
    inside = [m for m in minutes if first <= m.minute <= last]
    merged = sum(m.merged for m in inside)
    gate_seconds = sum(m.gate_seconds for m in inside)
    return MergeWindow(
        hours=hours,
        merged=merged,
        per_hour=round(merged / hours, 2),
        batches=sum(m.batches for m in inside),
        gate_seconds=round(gate_seconds, 3),
        gate_minutes_per_merge=round(gate_seconds / 60 / merged, 3) if merged else None,
    )


def _started(job: GateJob) -> datetime:
    return job.started_at or job.requested_at


def _seconds(delta: timedelta) -> float:
    """A duration in seconds, to the millisecond; never below 0 (clocks of two hosts)."""
    return max(0.0, round(delta.total_seconds(), 3))
