"""A rig's queue as a whole: paused when every merge request would meet the same cause (the target refuses pushes
for its own reasons, or a gate fails on the target's tip twice in a row), one escalation per pause. Pure."""

from __future__ import annotations

import msgspec

from services.refinery.plan.policy import Policy
from services.refinery.state import MergeQueue, RefineryState
from shared.model.commands import EscalationRaise
from shared.model.decision import NewEvent
from shared.model.events import MergeQueuePaused, MergeQueueTargetFailed
from shared.model.events.merge_queues import GATE_BROKEN


def paused_queues(state: RefineryState) -> list[MergeQueue]:
    """The rigs' queues paused now, by rig: each is owed one escalation (named after its pause)."""
    return [queue for _, queue in sorted(state.queues.items()) if queue.paused]


def pause(state: RefineryState, rig: str, cause: str, reason: str, mr_id: str, detail: str) -> NewEvent | None:
    """The rig's queue paused for ``cause`` (None: it is paused already; one pause, one escalation)."""
    queue = state.queues.get(rig)
    if queue is not None and queue.paused:
        return None
    paused = MergeQueuePaused(rig=rig, cause=cause, reason=reason[:2000], mr_id=mr_id, detail=detail[-4000:])
    return NewEvent(payload=paused, expected_seq=queue.version if queue is not None else 0)


class TargetFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A gate that failed on a merge request and on the target's tip too."""

    gate: str
    command: str
    target: str
    commit: str
    exit_code: int
    tail: str


def target_failed(
    state: RefineryState, rig: str, mr_id: str, failure: TargetFailure, policy: Policy
) -> NewEvent | None:
    """What a gate failing on the target's tip means for the rig's queue. Nobody is blamed and nothing merges
    with a gate skipped: the merge requests go back into the queue (the caller requeues them). The first failure
    in a row is recorded (a flaky tip gets another chance); the ``policy.target_failures_to_pause``-th pauses the
    queue, a gate command that cannot pass (a typo, a missing tool) or a broken target being the operator's.
    None when the queue is paused already."""
    queue = state.queues.get(rig)
    in_a_row = (queue.target_failures if queue is not None else 0) + 1
    if in_a_row < policy.target_failures_to_pause:
        event = MergeQueueTargetFailed(
            rig=rig,
            gate=failure.gate,
            target=failure.target,
            commit=failure.commit,
            exit_code=failure.exit_code,
            tail=failure.tail[-4000:],
            in_a_row=in_a_row,
        )
        return NewEvent(payload=event, expected_seq=queue.version if queue is not None else 0)
    reason = (
        f"the {failure.gate} gate ({failure.command!r}) fails on {failure.target} itself, {in_a_row} times in a "
        f"row (last at {failure.commit[:10]}, exit {failure.exit_code}): a gate command that cannot pass (a typo, "
        f"a missing tool) or a broken {failure.target}: fix the gate (`gt rig update {rig} --{failure.gate} ...`) "
        f"or {failure.target}"  # every view of a pause adds how to resume it
    )
    return pause(state, rig, GATE_BROKEN, reason, mr_id, failure.tail)


def escalation(state: RefineryState, queue: MergeQueue) -> EscalationRaise:
    """The one escalation of a pause of a rig's queue, named after the pause (sent again after a restart: the mayor
    answers it from its stored outcome). Resolved when the merge request that met the cause merges."""
    mr = state.mrs.get(queue.mr_id)
    waiting = sum(1 for m in state.mrs.values() if m.rig == queue.rig and m.status == "queued")
    message = (
        f"the merge queue of rig {queue.rig} is paused: {queue.reason}. {waiting} merge request(s) wait; "
        f"no gate runs until `gt mq resume {queue.rig}`.\n{queue.detail}"
    )
    resolved = [f"mr:{queue.mr_id}"] + ([f"bead:{mr.bead}"] if mr is not None else [])
    return EscalationRaise(
        severity="high",
        message=message[:9000],
        source=f"refinery/{queue.rig}",
        bead=mr.bead if mr is not None else None,
        resolved_when=resolved,
        cmd_id=f"esc-mq-{queue.rig}-{queue.pauses}",
    )
