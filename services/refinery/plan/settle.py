"""What a merge request's outcome settles: the events to append and the commands to send, in the order the failure
windows need (docs/failure-behaviour.md). Pure: the state, the policy and the time come in; ``Settlement`` comes
out, and the service carries it out (``effects/settling.py``).

- merged (or all of it on the target already): ``mr.merged``, then the bead's close, then its branch deleted;
- a conflict: back to the bead's agent (``mr.conflicted``, sent back) until ``max_conflict_returns``, then a
  conflict bead for a person (its create command first, the event naming the id it is settled under);
- a gate failed (or the branch is gone): ``mr.failed``, escalated (first) once the bead failed ``max_failures``
  times;
- deferred, or a gate failing on the target too: back into the queue, its retries in a row carried;
- a push refused: by the target itself, the rig's queue pauses and the merge request goes back into it; a target
  that moved or a repository out of reach, back into the queue after a backoff (``retry_at``) until
  ``push_retries``, then failed and escalated; anything else (a hook), failed and escalated at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Literal

import msgspec

from services.refinery.plan import refusals
from services.refinery.plan.outcomes import BatchResult, GateResult, Outcome, TargetFailed
from services.refinery.plan.pauses import TargetFailure, pause, target_failed
from services.refinery.plan.policy import Policy
from services.refinery.plan.queue import failures_of, submitted_order
from services.refinery.state import MergeRequest, RefineryState
from shared.model.commands import BeadClose, BeadCreate, Command, EscalationRaise
from shared.model.crew import crew_of_branch
from shared.model.decision import NewEvent
from shared.model.events import (
    Event,
    MergeRequestConflicted,
    MergeRequestFailed,
    MergeRequestMerged,
    MergeRequestRequeued,
)
from shared.model.events.merge_queues import PUSH_REFUSED

Counted = Literal["merged", "failed", "conflicted"]


@dataclass(frozen=True, slots=True)
class LogLine:
    """A line the refinery logs once the settlement is carried out."""

    event: str
    fields: Mapping[str, object] = field(default_factory=dict)
    level: Literal["info", "warning"] = "info"


@dataclass(frozen=True, slots=True)
class Settlement:
    """What one outcome settles, carried out in this order: ``publish_branch``, ``commands``, ``events``, the
    logs and ``counted``, ``close``, ``delete_branch``."""

    events: list[NewEvent] = field(default_factory=list)
    """Appended one after the other, each expecting its aggregate's version in the state it was settled from."""
    commands: list[Command] = field(default_factory=list)
    """Sent before the events (an escalation, a conflict bead): a crash in between sends them again under the
    same ids, and the event says they went."""
    close: BeadClose | None = None
    """The bead's close, sent once the events are in the log (a crash before it: ``owed.beads_to_close``)."""
    publish_branch: bool = False
    """Publish the polecat's bundle as a branch in the rig's repository, for the person who resolves a conflict
    (it published a bundle, it pushed nothing): a resolution pushed there is what the queue takes next."""
    delete_branch: bool = False
    """Delete the merged branch from the rig's repository, last."""
    counted: Counted | None = None
    """The refinery's figure it adds to (``gt status``)."""
    logs: list[LogLine] = field(default_factory=list)

    def sent_under(self, requested: str, settled: str) -> list[NewEvent]:
        """The events, with the command sent as ``requested`` named by the id it is settled under (another only
        when some other sender took ``requested`` first)."""
        out = []
        for new in self.events:
            payload = new.payload
            if isinstance(payload, MergeRequestConflicted) and payload.conflict_command == requested:
                new = replace(new, payload=msgspec.structs.replace(payload, conflict_command=settled))
            out.append(new)
        return out


def settle(
    state: RefineryState, mr: MergeRequest, outcome: Outcome, result: BatchResult, policy: Policy, now: datetime
) -> Settlement:
    """What ``outcome`` of ``mr`` (processed in the batch of ``result``) settles."""
    if outcome.kind in ("merged", "already_merged"):
        return merged(state, mr, outcome, result)
    if outcome.kind == "conflict":
        return conflicted(state, mr, outcome, policy)
    if outcome.kind in ("failed", "branch_missing"):
        assert outcome.failure is not None
        return failed(state, mr, outcome.failure, policy)
    if outcome.kind in ("deferred", "target_failed"):
        # Not a failure of its own: the count of retries in a row is carried, not reset.
        reason = outcome.reason
        if outcome.kind == "target_failed":
            assert outcome.failure is not None
            reason = f"its {outcome.failure.gate} gate fails on {mr.target} too: not its failure"
        return Settlement(events=[_requeued(state, mr, reason)])
    return push_refused(state, mr, outcome, policy, now)


def merged(state: RefineryState, mr: MergeRequest, outcome: Outcome, result: BatchResult) -> Settlement:
    already = outcome.kind == "already_merged"
    event = MergeRequestMerged(
        mr_id=mr.id,
        merged_commit=outcome.merged_commit,
        target_before=outcome.target_before,
        gates_run=result.gates_run,
        gate_seconds=round(result.gate_seconds, 3),
        batch=result.merged if len(result.merged) > 1 else [],
        already=already,
        flaky=result.flaky.get(mr.id, []),
    )
    # The close names the merge as its event records it.
    current = msgspec.structs.replace(_current(state, mr), already=already)
    return Settlement(
        events=[_on(state, mr, event)],
        close=BeadClose(id=mr.bead, reason=close_reason(state, current), cmd_id=f"close-{mr.id}"),
        delete_branch=True,
        counted="merged",
        logs=[LogLine("mr_merged", {"commit": outcome.merged_commit, "already": already})],
    )


def conflicted(state: RefineryState, mr: MergeRequest, outcome: Outcome, policy: Policy) -> Settlement:
    # An agent first: the witness gives the bead a fresh session told to rebase and resolve; a person only once
    # agents did not manage (or there is no agent's session to send it back to).
    sent_back = send_conflict_back(state, mr, policy)
    create = None if sent_back else conflict_bead(state, mr, outcome)
    commands: list[Command] = [create] if create is not None else []
    event = MergeRequestConflicted(
        mr_id=mr.id,
        target_commit=outcome.target_before,
        conflict_command=create.cmd_id or "" if create is not None else "",
        files=outcome.files,
        sent_back=sent_back,
    )
    return Settlement(
        events=[_on(state, mr, event)],
        commands=commands,
        # For a person to resolve on; a crew member's conflict is resolved in its workspace.
        publish_branch=not sent_back and mr.bundle is not None and crew_of_branch(mr.branch) is None,
        counted="conflicted",
        logs=[LogLine("mr_conflicted", {"files": outcome.files, "sent_back": sent_back})],
    )


def failed(state: RefineryState, mr: MergeRequest, failure: GateResult, policy: Policy) -> Settlement:
    """A gate failed: back to the polecat, or escalated once the bead failed ``max_failures`` times."""
    failures = failures_of(state, mr.bead) + 1
    escalate = failures >= policy.max_failures
    event = MergeRequestFailed(
        mr_id=mr.id, gate=failure.gate, exit_code=failure.exit_code, tail=failure.tail, escalated=escalate
    )
    return Settlement(
        events=[_on(state, mr, event)],
        commands=[failures_escalation(mr, failure, failures)] if escalate else [],
        counted="failed",
        logs=[LogLine("mr_failed", {"gate": failure.gate, "exit_code": failure.exit_code, "escalated": escalate})],
    )


def push_refused(state: RefineryState, mr: MergeRequest, outcome: Outcome, policy: Policy, now: datetime) -> Settlement:
    """A target that moved or a repository out of reach: tried again later, a bounded number of times. A refusal
    of the target's own (a checked-out branch with changes, a permission) pauses the rig's queue, the merge
    request back in it: every other would meet it too. Any other refusal (a hook) fails the merge request at once
    with git's message, escalated: nothing the polecat could change."""
    assert outcome.failure is not None
    rig = state.rigs.get(mr.rig)
    why = refusals.why(outcome.refusal, mr.target, rig.repo if rig is not None else mr.rig)
    if outcome.refusal in refusals.TARGET_SIDE:
        return paused(state, mr, PUSH_REFUSED, why, outcome.failure.tail)
    if outcome.refusal in refusals.RETRYABLE:
        reason = (
            "the target moved during the merge"
            if outcome.refusal == refusals.MOVED
            else f"the repository could not be reached: {outcome.failure.tail}"[:500]
        )
        return retry_later(state, mr, reason, outcome.failure, why, policy, now)
    return fail_and_escalate(state, mr, outcome.failure, why)


def paused(state: RefineryState, mr: MergeRequest, cause: str, why: str, detail: str) -> Settlement:
    """The rig's queue paused (once: one escalation, ``pauses.escalation``) and ``mr`` put back into it."""
    pausing = pause(state, mr.rig, cause, why, mr.id, detail)
    reason = f"the queue of rig {mr.rig} is paused: {why}"[:500]
    logs = [LogLine("merge_queue_paused", {"rig": mr.rig, "cause": cause, "why": why}, "warning")]
    return Settlement(
        events=([pausing] if pausing is not None else []) + [_requeued(state, mr, reason)],
        logs=logs if pausing is not None else [],
    )


def retry_later(
    state: RefineryState, mr: MergeRequest, reason: str, failure: GateResult, why: str, policy: Policy, now: datetime
) -> Settlement:
    """Back into the queue not before a backoff recorded in the log (a restart waits the same), or failed and
    escalated once it went back too often in a row."""
    current = _current(state, mr)
    not_before = retry_at(current.retries, now, policy)
    if not_before is None:
        tries = current.retries + 1
        return fail_and_escalate(state, mr, failure, f"{why}; given up after {tries} attempts in a row")
    event = MergeRequestRequeued(mr_id=mr.id, reason=reason, retries=current.retries + 1, not_before=not_before)
    fields = {"reason": reason, "retries": event.retries, "not_before": not_before.isoformat()}
    return Settlement(events=[_on(state, mr, event)], logs=[LogLine("mr_retry_later", fields)])


def fail_and_escalate(state: RefineryState, mr: MergeRequest, failure: GateResult, why: str) -> Settlement:
    """Failed and escalated at once: nothing the polecat could change, or retried too often in a row."""
    current = _current(state, mr)
    said = "git said" if failure.gate == "push" else "the last error"
    message = (
        f"merge request {mr.id} (bead {mr.bead}) of rig {mr.rig} was not merged into {mr.target}: {why}. "
        f"{said}:\n{failure.tail}\nOnce fixed, `gt mq retry {mr.id}` puts it back into the queue."
    )
    escalation = EscalationRaise(
        severity="high",
        message=message,
        source=f"refinery/{mr.rig}",
        bead=mr.bead,
        # Fixed and retried, it merges; or the bead was closed otherwise: either way nothing is left to do.
        resolved_when=[f"mr:{mr.id}", f"bead:{mr.bead}"],
        cmd_id=f"esc-{failure.gate}-{mr.id}-{current.attempts}",
    )
    event = MergeRequestFailed(
        mr_id=mr.id, gate=failure.gate, exit_code=failure.exit_code, tail=failure.tail, escalated=True
    )
    fields = {"gate": failure.gate, "exit_code": failure.exit_code, "why": why}
    return Settlement(
        events=[_on(state, mr, event)],
        commands=[escalation],
        counted="failed",
        logs=[LogLine("mr_escalated", fields, "warning")],
    )


def processing_failed(
    state: RefineryState, mr_id: str, holder: str, error: str, policy: Policy, now: datetime
) -> Settlement | None:
    """A batch whose processing failed (git, a bug): each merge request still claimed by ``holder`` goes back
    into the queue after a backoff, escalated after too many in a row (None: not ours any more)."""
    current = state.mrs.get(mr_id)
    if current is None or current.status != "claimed" or current.holder != holder:
        return None
    failure = GateResult(gate="error", exit_code=1, seconds=0.0, tail=error[-2000:], log_path="")
    why = "its processing kept failing"
    return retry_later(state, current, f"error: {error}"[:500], failure, why, policy, now)


def target_failing(
    state: RefineryState, first: MergeRequest, failed: TargetFailed, policy: Policy
) -> Settlement | None:
    """A gate failed on the target's tip too: recorded for the rig's queue, which pauses the second time in a row
    (``pauses.target_failed``); the batch's merge requests go back into the queue, each by its own outcome."""
    failure = TargetFailure(
        gate=failed.result.gate,
        command=failed.command,
        target=first.target,
        commit=failed.commit,
        exit_code=failed.result.exit_code,
        tail=failed.result.tail,
    )
    event = target_failed(state, first.rig, first.id, failure, policy)
    if event is None:
        return None
    fields = {"gate": failure.gate, "exit_code": failure.exit_code, "recorded": event.payload.TYPE}
    return Settlement(events=[event], logs=[LogLine("gate_fails_on_target", fields, "warning")])


# ---- the follow-up commands -----------------------------------------------------------------------------


def conflict_bead(state: RefineryState, mr: MergeRequest, outcome: Outcome) -> BeadCreate:
    """The bead a person resolves a conflict of ``mr`` under (its agents did not, or it has none)."""
    bead = state.beads.get(mr.bead)
    title = bead.title if bead else mr.bead
    returns = bead.conflicts_sent_back if bead else 0
    tried = f"Its agent was sent {returns} conflict(s) of this bead to resolve already.\n" if returns else ""
    description = (
        f"Merge request {mr.id} (bead {mr.bead}) does not rebase onto {mr.target}.\n{tried}"
        f"Branch: {mr.branch} at {mr.head}\nTarget: {mr.target} at {outcome.target_before}\n"
        f"Conflicting files: {', '.join(outcome.files) or 'unknown'}\n"
        f"Rebase the branch onto {mr.target}, integrating its change with what landed: keep what is on "
        f"{mr.target} working and re-apply the branch's change on top of it (where they contradict, what "
        "landed stands; never both sides of a conflict side by side), so the gates pass. Push it and close "
        "this bead: the merge request goes back into the queue."
    )
    return BeadCreate(
        title=f"Resolve merge conflicts: {title}"[:200],
        priority=1,
        description=description,
        labels=["merge-conflict"],
        metadata={"mr": mr.id, "bead": mr.bead, "head": mr.head, "target_commit": outcome.target_before},
        prefix=state.rigs[mr.rig].prefix,
        cmd_id=f"conflict-{mr.id}-{mr.attempts}",
    )


def failures_escalation(mr: MergeRequest, failure: GateResult, failures: int) -> EscalationRaise:
    """A bead whose gates failed ``max_failures`` times: not sent back again."""
    message = (
        f"bead {mr.bead} failed its {failure.gate} gate {failures} times in the merge queue of rig {mr.rig} "
        f"(last: merge request {mr.id}, exit {failure.exit_code}); it is not sent back again. "
        f"`gt mq show {mr.id}` has the log tail."
    )
    return EscalationRaise(
        severity="high",
        message=message,
        source=f"refinery/{mr.rig}",
        bead=mr.bead,
        resolved_when=[f"mr:{mr.id}", f"bead:{mr.bead}"],
        cmd_id=f"esc-{mr.id}",
    )


# ---- the rules they follow -------------------------------------------------------------------------------


def retry_at(retries: int, now: datetime, policy: Policy) -> datetime | None:
    """When a merge request that did not land for the ``retries + 1``-th time in a row (its push was refused as
    retryable, or its processing failed) may be taken again: after an exponential backoff; None once it has been
    retried ``policy.push_retries`` times already (it is failed and escalated then, never looped)."""
    if retries >= policy.push_retries:
        return None
    delay = min(policy.push_backoff_s * 2**retries, policy.push_backoff_max_s)
    return now + timedelta(seconds=delay)


def send_conflict_back(state: RefineryState, mr: MergeRequest, policy: Policy) -> bool:
    """Whether a conflict of ``mr`` goes back to its bead's agent (a fresh session resolves it) rather than to
    the operator: it came from an agent's session (``gt done``), and fewer than ``max_conflict_returns`` of the
    bead's conflicts went back already (an agent that keeps conflicting needs a person)."""
    bead = state.beads.get(mr.bead)
    return mr.session is not None and bead is not None and bead.conflicts_sent_back < policy.max_conflict_returns


def landed_with(state: RefineryState, mr: MergeRequest) -> MergeRequest | None:
    """The merge request of another bead that landed the same head commit on the same rig and target, if one
    is known."""
    found = [
        other
        for other in state.mrs.values()
        if other.bead != mr.bead
        and (other.rig, other.target, other.head) == (mr.rig, mr.target, mr.head)
        and other.status == "merged"
        and not other.already
    ]
    return min(found, key=submitted_order, default=None)


def close_reason(state: RefineryState, mr: MergeRequest) -> str:
    """Why a merged merge request's bead closes. One whose every commit was on the target already says so, and
    names the other bead's merge request that landed the same commit when there is one."""
    reason = f"merged in {mr.id}"
    if not mr.already:
        return reason
    reason += f": its work was already on {mr.target}"
    other = landed_with(state, mr)
    if other is not None:
        reason += f"; commit {mr.head[:10]} landed with {other.id} (bead {other.bead})"
    return reason


def _current(state: RefineryState, mr: MergeRequest) -> MergeRequest:
    return state.mrs.get(mr.id, mr)


def _on(state: RefineryState, mr: MergeRequest, event: Event) -> NewEvent:
    """``event`` of ``mr``, expecting its version now."""
    return NewEvent(payload=event, expected_seq=_current(state, mr).version)


def _requeued(state: RefineryState, mr: MergeRequest, reason: str) -> NewEvent:
    """Back into the queue, its retries in a row carried (not a failure of its own)."""
    return _on(state, mr, MergeRequestRequeued(mr_id=mr.id, reason=reason, retries=_current(state, mr).retries))
