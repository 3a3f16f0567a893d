"""The refinery's projection: merge requests, plus the beads and rigs they are checked and processed against."""

from __future__ import annotations

import functools
from datetime import datetime, timedelta

from services.refinery.state import (
    MergeMinute,
    MergeQueue,
    MergeRequest,
    RefineryState,
    RunnerTally,
    SessionRef,
    WorkBead,
)
from shared.core.ids import HOOK_LEASE_PREFIX, MERGE_LEASE_PREFIX, hook_lease_name
from shared.model import gates
from shared.model.events import (
    BeadClaimed,
    BeadClosed,
    BeadCreated,
    BeadSlung,
    CommandAccepted,
    ConvoyBeadsAdded,
    ConvoyCreated,
    Envelope,
    Event,
    GateJobEvent,
    GateJobFinished,
    GcSwept,
    LeaseEvent,
    MergeQueueEvent,
    MergeQueuePaused,
    MergeQueueResumed,
    MergeQueueTargetFailed,
    MergeRequestClaimed,
    MergeRequestConflicted,
    MergeRequestFailed,
    MergeRequestMerged,
    MergeRequestRejected,
    MergeRequestRequeued,
    MergeRequestSubmitted,
    RigEvent,
    SessionRequested,
)
from shared.model.events.beads import forward
from shared.model.events.gate_jobs import GATE_JOB_OPEN
from shared.model.events.merge_requests import MR_FINISHED, MrStatus
from shared.model.fold import touch
from shared.model.gate_jobs import fold_gate_job
from shared.model.leases import fold_lease
from shared.model.rigs import fold_rig
from shared.service.projection import Projection

SCHEMA_VERSION = 14
"""14: molecules with a gate not opened (``gates``). 13: merges by rig and minute (merges per hour, gate minutes per
merge) and the runners' finished jobs. 12: gate
jobs on the runners. 11: rigs' ``gate_pristine`` (each merge's gates in a fresh workspace). 10: a merge request
records its rig's incarnation (a removed rig's name added again). 9: rigs' merge queues (paused, failures on the
target). 8: a merge request records the bundle its session published. 7: hook and merge leases are one record
(``shared.model.leases.Lease``), rigs the witness's record (``shared.model.rigs.Rig``): a snapshot from before has
hooks without their name, TTL and times, and rigs without their other settings."""
CONFLICT_PREFIX = "conflict-"
"""Command ids of conflict bead creates (the refinery's own): their outcomes name the bead."""
NOT_WORK = frozenset({"message", "convoy", "escalation"})
MERGE_HISTORY = timedelta(hours=24)
"""How far back (in the log's time, from the newest merge) ``RefineryState.merges`` keeps its minutes: at most
1,440 a rig, however many merge."""
KEEP_RUNNERS = 100
"""Runners whose finished jobs are counted (those that finished one last)."""


@functools.singledispatch
def fold(payload: Event, state: RefineryState, env: Envelope, seq: int) -> None:
    """Events the refinery does not track change nothing."""


@fold.register
def _bead_created(payload: BeadCreated, state: RefineryState, env: Envelope, seq: int) -> None:
    if payload.type not in NOT_WORK:
        state.beads.setdefault(
            payload.bead_id, WorkBead(id=payload.bead_id, title=payload.title, priority=payload.priority)
        )


@fold.register
def _bead_slung(payload: BeadSlung, state: RefineryState, env: Envelope, seq: int) -> None:
    bead = state.beads.get(payload.bead_id)
    if bead is not None:
        bead.rig = payload.rig
        bead.status = forward(bead.status, "hooked")


@fold.register
def _bead_claimed(payload: BeadClaimed, state: RefineryState, env: Envelope, seq: int) -> None:
    if (bead := state.beads.get(payload.bead_id)) is not None:
        bead.status = forward(bead.status, "in_progress")


@fold.register
def _bead_closed(payload: BeadClosed, state: RefineryState, env: Envelope, seq: int) -> None:
    bead = state.beads.get(payload.bead_id)
    if bead is not None:
        bead.status = "closed"
    # A closed bead takes no submissions: who held its hook matters no more.
    state.hooks.pop(hook_lease_name(payload.bead_id), None)
    for session in [s for s, ref in state.sessions.items() if ref.bead == payload.bead_id]:
        del state.sessions[session]


@fold.register
def _session_requested(payload: SessionRequested, state: RefineryState, env: Envelope, seq: int) -> None:
    bead = state.beads.get(payload.bead)
    if bead is not None and bead.status != "closed":
        state.sessions[payload.session_id] = SessionRef(bead=payload.bead, branch=payload.branch)


def _track(state: RefineryState, beads: list[str], since: datetime) -> None:
    for bead_id in beads:
        bead = state.beads.get(bead_id)
        if bead is not None and (bead.convoy_since is None or since < bead.convoy_since):
            bead.convoy_since = since


@fold.register
def _convoy_created(payload: ConvoyCreated, state: RefineryState, env: Envelope, seq: int) -> None:
    state.convoys.setdefault(payload.convoy_id, env.ts)
    _track(state, payload.beads, state.convoys[payload.convoy_id])


@fold.register
def _convoy_beads_added(payload: ConvoyBeadsAdded, state: RefineryState, env: Envelope, seq: int) -> None:
    _track(state, payload.beads, state.convoys.get(payload.convoy_id, env.ts))


@fold.register
def _rig(payload: RigEvent, state: RefineryState, env: Envelope, seq: int) -> None:
    fold_rig(payload, state.rigs, env, seq)


@fold.register
def _accepted(payload: CommandAccepted, state: RefineryState, env: Envelope, seq: int) -> None:
    created = payload.created_id()
    if not payload.command_id.startswith(CONFLICT_PREFIX) or created is None:
        return
    state.created[payload.command_id] = created
    mr = state.mrs.get(state.awaited.pop(payload.command_id, ""))
    if mr is not None and mr.conflict_command == payload.command_id:
        mr.blocked_by = created


@fold.register
def _submitted(payload: MergeRequestSubmitted, state: RefineryState, env: Envelope, seq: int) -> None:
    if payload.mr_id in state.mrs:
        return
    state.mrs[payload.mr_id] = MergeRequest(
        id=payload.mr_id,
        bead=payload.bead,
        rig=payload.rig,
        branch=payload.branch,
        target=payload.target,
        head=payload.head,
        priority=payload.priority,
        session=payload.session,
        bundle=payload.bundle,
        submitted_at=env.ts,
        queued_at=env.ts,
        incarnation=rig.incarnation if (rig := state.rigs.get(payload.rig)) is not None else 1,
        version=seq,
    )


@fold.register
def _claimed(payload: MergeRequestClaimed, state: RefineryState, env: Envelope, seq: int) -> None:
    if (mr := touch(state.mrs, payload.mr_id, seq)) is not None:
        mr.status, mr.attempts, mr.batch = "claimed", payload.attempt, list(payload.batch)
        mr.holder, mr.lease_until = payload.holder, payload.lease_until


def _finished(state: RefineryState, mr_id: str, seq: int, status: MrStatus, at: datetime) -> MergeRequest | None:
    """The merge request an event finishes (see ``touch``): in ``status``, out of its holder's hands since ``at``."""
    if (mr := touch(state.mrs, mr_id, seq)) is not None:
        mr.status, mr.holder, mr.lease_until, mr.ended_at = status, None, None, at
    return mr


@fold.register
def _conflicted(payload: MergeRequestConflicted, state: RefineryState, env: Envelope, seq: int) -> None:
    if payload.sent_back:
        # The agent resolves it and submits the resolved branch as a new merge request: this one is finished.
        mr = _finished(state, payload.mr_id, seq, "conflicted", env.ts)
        if mr is not None and (bead := state.beads.get(mr.bead)) is not None:
            bead.conflicts_sent_back += 1
    elif (mr := touch(state.mrs, payload.mr_id, seq)) is not None:
        mr.status, mr.conflict_command = "blocked", payload.conflict_command
        mr.blocked_by = state.created.get(payload.conflict_command)  # its outcome may be in the log already
        mr.holder = mr.lease_until = None
        if mr.blocked_by is None:
            state.awaited[payload.conflict_command] = mr.id


@fold.register
def _failed(payload: MergeRequestFailed, state: RefineryState, env: Envelope, seq: int) -> None:
    status: MrStatus = "escalated" if payload.escalated else "failed"
    if (mr := _finished(state, payload.mr_id, seq, status, env.ts)) is not None:
        mr.failures += 1
        mr.gate, mr.exit_code, mr.tail = payload.gate, payload.exit_code, payload.tail


@fold.register
def _merged(payload: MergeRequestMerged, state: RefineryState, env: Envelope, seq: int) -> None:
    known = state.mrs.get(payload.mr_id)
    newly = known is not None and known.status != "merged"
    if (mr := _finished(state, payload.mr_id, seq, "merged", env.ts)) is not None:
        mr.merged_commit, mr.already, mr.batch = payload.merged_commit, payload.already, list(payload.batch)
        mr.bug_bead_command = payload.bug_bead_command
        queue = state.queues.get(mr.rig)
        if queue is not None and not payload.already:
            queue.target_failures = 0  # its gates passed: the target's failures are no longer in a row
        if newly:
            _count_merge(state, mr.rig, payload, env.ts)


def batch_key(payload: MergeRequestMerged) -> str:
    """What the merge requests of one batch share and the next batch of the rig does not: the target's tip it
    stood on, and the gates it ran (their number and time). Two batches alike in all three merged only what the
    target held already, on the same tip, with the same gates: counted as one, their gate time is not lost."""
    return f"{payload.target_before}:{payload.gates_run}:{payload.gate_seconds}"


def _count_merge(state: RefineryState, rig: str, payload: MergeRequestMerged, at: datetime) -> None:
    """``payload``'s merge counted in its rig's minute; its batch's gate time with the first of the batch."""
    minute = at.replace(second=0, microsecond=0)
    bucket = None
    for seen in reversed(state.merges):
        if seen.minute < minute:
            break
        if seen.minute == minute and seen.rig == rig:
            bucket = seen
            break
    if bucket is None:
        bucket = MergeMinute(rig=rig, minute=minute)
        state.merges.append(bucket)
        cutoff = minute - MERGE_HISTORY
        if state.merges[0].minute < cutoff:
            state.merges = [m for m in state.merges if m.minute >= cutoff]
    bucket.merged += 1
    key = batch_key(payload)
    if state.last_batch.get(rig) != key:
        state.last_batch[rig] = key
        bucket.batches += 1
        bucket.gate_seconds += payload.gate_seconds


def _queue(state: RefineryState, payload: MergeQueueEvent, seq: int) -> MergeQueue:
    queue = state.queues.setdefault(payload.rig, MergeQueue(rig=payload.rig))
    queue.version = seq
    return queue


@fold.register
def _queue_paused(payload: MergeQueuePaused, state: RefineryState, env: Envelope, seq: int) -> None:
    queue = _queue(state, payload, seq)
    queue.paused, queue.paused_at, queue.pauses = True, env.ts, queue.pauses + 1
    queue.cause, queue.reason, queue.mr_id, queue.detail = payload.cause, payload.reason, payload.mr_id, payload.detail
    queue.target_failures = 0


@fold.register
def _queue_resumed(payload: MergeQueueResumed, state: RefineryState, env: Envelope, seq: int) -> None:
    queue = _queue(state, payload, seq)
    queue.paused, queue.target_failures = False, 0


@fold.register
def _queue_target_failed(payload: MergeQueueTargetFailed, state: RefineryState, env: Envelope, seq: int) -> None:
    _queue(state, payload, seq).target_failures = payload.in_a_row


@fold.register
def _requeued(payload: MergeRequestRequeued, state: RefineryState, env: Envelope, seq: int) -> None:
    if (mr := touch(state.mrs, payload.mr_id, seq)) is not None:
        mr.status, mr.queued_at, mr.reason = "queued", env.ts, payload.reason
        mr.retries, mr.not_before = payload.retries, payload.not_before
        mr.holder = mr.lease_until = None
        mr.blocked_by = mr.conflict_command = None
        mr.ended_at = None


@fold.register
def _rejected(payload: MergeRequestRejected, state: RefineryState, env: Envelope, seq: int) -> None:
    if (mr := _finished(state, payload.mr_id, seq, "rejected", env.ts)) is not None:
        mr.reason = payload.reason


@fold.register
def _lease(payload: LeaseEvent, state: RefineryState, env: Envelope, seq: int) -> None:
    if payload.lease.startswith(MERGE_LEASE_PREFIX):
        fold_lease(payload, state.merge_leases, env, seq)
    elif payload.lease.startswith(HOOK_LEASE_PREFIX):
        fold_lease(payload, state.hooks, env, seq)


@fold.register
def _gate_job(payload: GateJobEvent, state: RefineryState, env: Envelope, seq: int) -> None:
    job = state.gate_jobs.get(payload.job_id)
    was_open = job is not None and job.status in GATE_JOB_OPEN
    fold_gate_job(payload, state.gate_jobs, env, seq)
    if isinstance(payload, GateJobFinished) and was_open:
        tally = state.runners.setdefault(payload.runner, RunnerTally())
        tally.jobs_run += 1
        tally.jobs_passed += int(payload.passed)
        tally.gate_seconds += sum(result.seconds for result in payload.results)
        tally.last_finished_at = env.ts
        if len(state.runners) > KEEP_RUNNERS:
            least = min(state.runners, key=lambda name: state.runners[name].last_finished_at or env.ts)
            del state.runners[least]


@fold.register
def _gc_swept(payload: GcSwept, state: RefineryState, env: Envelope, seq: int) -> None:
    """Merge requests that finished (merged, failed, escalated, rejected) before the cutoff and whose bead is
    closed leave, with the conflict-bead commands that point to them. A merged one whose bead is still open
    stays: the refinery still owes closing the bead."""
    gone: list[str] = []
    for mr in state.mrs.values():
        if mr.status not in MR_FINISHED or mr.ended_at is None or mr.ended_at >= payload.cutoff:
            continue
        bead = state.beads.get(mr.bead)
        if bead is None or bead.status == "closed":
            gone.append(mr.id)
    if not gone:
        return
    for mr_id in gone:
        del state.mrs[mr_id]
    for command in [c for c, mr_id in state.awaited.items() if mr_id in gone]:
        del state.awaited[command]
    prefixes = tuple(f"{CONFLICT_PREFIX}{mr_id}-" for mr_id in gone)
    for command in [c for c in state.created if c.startswith(prefixes)]:
        del state.created[command]


def fold_all(payload: Event, state: RefineryState, env: Envelope, seq: int) -> None:
    """``fold``, and the molecules with a gate not opened (``shared.model.gates.fold_book``)."""
    fold(payload, state, env, seq)
    gates.fold_book(state.gates, payload, env.ts)


def new_projection() -> Projection[RefineryState]:
    return Projection(
        "refinery", RefineryState, fold_all, schema_version=SCHEMA_VERSION, snapshot_after=frozenset({GcSwept.TYPE})
    )
