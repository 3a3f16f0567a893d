"""The refinery's decisions on commands: a branch enters its rig's merge queue. Pure."""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import msgspec

from services.refinery.state import MergeRequest, RefineryState
from shared.core.errors import CommandError
from shared.core.ids import hook_lease_name
from shared.model import gates
from shared.model.commands import (
    Command,
    MergeQueueResume,
    MergeRequestDone,
    MergeRequestReject,
    MergeRequestRetry,
    MergeRequestSubmit,
)
from shared.model.commands.rigs import mr_id_for as mr_id_for  # the merge request id is the model's; re-exported here
from shared.model.crew import crew_of_branch
from shared.model.decision import Accepted, DecideContext, NewEvent
from shared.model.events import MergeQueueResumed, MergeRequestRejected, MergeRequestRequeued, MergeRequestSubmitted
from shared.model.events.merge_requests import MR_IN_QUEUE, MR_SENT_BACK
from shared.model.results import MergeQueueResult, MrResult

PROTECTED_BRANCHES = frozenset({"HEAD", "main", "master", "trunk", "develop", "release", "production", "stable"})
"""Branches a merge request submitted by hand may not name (nor ``release/...``, the rig's base branch, its
target): merging one would move, and its clean-up delete, a branch people keep."""


def legacy_mr_id(rig: str, head: str) -> str:
    """How merge requests were keyed before they belonged to their bead (rig and head only): a log written then
    holds them under these ids, and a resubmission of the same bead and head still finds its own there."""
    return "mr-" + hashlib.blake2b(f"{rig}:{head}".encode()).hexdigest()[:12]


def existing_mr(state: RefineryState, rig: str, bead: str, head: str) -> MergeRequest | None:
    """The bead's merge request for this head to the rig as it is now, if it was submitted already (under either
    key)."""
    record = state.rigs.get(rig)
    incarnation = record.incarnation if record is not None else 1
    mr = state.mrs.get(mr_id_for(rig, bead, head, incarnation))
    if mr is not None:
        return mr
    legacy = state.mrs.get(legacy_mr_id(rig, head)) if incarnation == 1 else None
    return legacy if legacy is not None and legacy.bead == bead else None


def of_a_former_rig(state: RefineryState, mr: MergeRequest) -> bool:
    """Submitted to an earlier incarnation of its rig (removed, then its name added again): never merged now."""
    rig = state.rigs.get(mr.rig)
    return rig is not None and mr.incarnation != rig.incarnation


def mr_result(mr: MergeRequest) -> MrResult:
    """A merge request asked for again unchanged: its whole record, as the answer always carried it."""
    return msgspec.convert({**msgspec.to_builtins(mr), "changed": False}, MrResult)


class BundleRefused(NamedTuple):
    """What ``RefineryService.prepare`` found wrong with a merge request's published bundle (too large, not a
    bundle of the rig, its branch not at the submitted head): the request is refused with it."""

    code: str
    message: str


def decide(state: RefineryState, cmd: Command, ctx: DecideContext) -> Accepted:
    match cmd:
        case MergeRequestSubmit():
            if isinstance(ctx.facts, BundleRefused):
                raise CommandError(ctx.facts.code, ctx.facts.message)
            return submit(state, cmd, ctx.actor)
        case MergeRequestRetry():
            return retry(state, cmd)
        case MergeRequestReject():
            return reject(state, cmd)
        case MergeQueueResume():
            return resume(state, cmd)
    raise CommandError("unknown_command", f"the refinery does not handle {cmd.SUBJECT}")


def from_session(cmd: MergeRequestSubmit, actor: str) -> bool:
    """Sent by (or for) a polecat session: it names one, carries a lease, comes from a polecat, or came on the
    agents' subject. Everything else was submitted by hand."""
    return isinstance(cmd, MergeRequestDone) or bool(cmd.session or cmd.fence) or actor.startswith("polecat:")


def check_session_submit(state: RefineryState, cmd: MergeRequestSubmit, base: str) -> None:
    """Only the session holding the bead's hook lease, with its token, submits the bead's work: its own branch,
    into the rig's base branch. (The intake refused a token that was not live already: ``conflict``.)"""
    lease = hook_lease_name(cmd.bead)
    if cmd.session is None:
        raise CommandError("unauthorized", "a polecat's merge request names its `session` (gt done sends it)")
    if cmd.fence is None or cmd.fence.lease != lease:
        raise CommandError(
            "unauthorized",
            f"a polecat's merge request carries the bead's hook lease as its `fence` ({lease} and the session's "
            "token, GT_LEASE and GT_LEASE_TOKEN; gt done sends them)",
        )
    hook = state.hooks.get(lease)
    if hook is None or hook.holder != cmd.session or hook.token != cmd.fence.token:
        now = f"held by {hook.holder} with token {hook.token}" if hook is not None else "never taken"
        raise CommandError(
            "unauthorized",
            f"session {cmd.session} with token {cmd.fence.token} does not hold {lease} ({now}): only the session "
            f"working bead {cmd.bead} submits its work",
        )
    session = state.sessions.get(cmd.session)
    if session is None or session.bead != cmd.bead:
        raise CommandError("unauthorized", f"session {cmd.session} is not a session of bead {cmd.bead}")
    if cmd.branch != session.branch:
        raise CommandError(
            "unauthorized", f"session {cmd.session} submits its own branch {session.branch}, not {cmd.branch!r}"
        )
    if cmd.target is not None and cmd.target != base:
        raise CommandError(
            "unauthorized", f"a polecat's work merges into the rig's base branch {base}, not {cmd.target!r}"
        )
    if (waiting := state.gates.get(cmd.bead)) is not None:
        # A gate is the town's word before the work goes on: its work is not merged past it.
        raise CommandError("gate_closed", gates.closed_gates_text(cmd.bead, waiting))


def check_hand_submit(state: RefineryState, cmd: MergeRequestSubmit, target: str, base: str) -> None:
    """A merge request submitted by hand (the operator): any branch but the target and the branches people keep;
    not for a bead a session works (its merge request comes from that session)."""
    if cmd.branch == target:
        raise CommandError("invalid", f"`branch` {cmd.branch!r} is the target: nothing to merge")
    if cmd.branch in PROTECTED_BRANCHES or cmd.branch == base or cmd.branch.startswith("release/"):
        raise CommandError(
            "invalid",
            f"`branch` {cmd.branch!r} is a protected branch ({', '.join(sorted(PROTECTED_BRANCHES))}, release/..., "
            f"the rig's base branch {base}): it is not merged and deleted through the merge queue",
        )
    hook = state.hooks.get(hook_lease_name(cmd.bead))
    if hook is not None and hook.status == "held":
        raise CommandError(
            "conflict",
            f"bead {cmd.bead} is worked by session {hook.holder}: its merge request comes from that session (gt done)",
        )


def submit(state: RefineryState, cmd: MergeRequestSubmit, actor: str = "operator") -> Accepted[MrResult]:
    if cmd.rig not in state.rigs:
        raise CommandError("not_found", f"no rig {cmd.rig!r} (`gt rig list` shows them)")
    bead = state.beads.get(cmd.bead)
    if bead is None:
        raise CommandError("not_found", f"no bead {cmd.bead!r} to merge work for")
    if bead.status == "closed":
        raise CommandError("backward_transition", f"bead {cmd.bead} is closed; its work is not merged any more")
    slung_to = bead.rig
    if slung_to is not None and slung_to != cmd.rig:
        raise CommandError("invalid", f"bead {cmd.bead} is slung to rig {slung_to}, not {cmd.rig}")
    base = state.rigs[cmd.rig].base_branch
    if from_session(cmd, actor):
        check_session_submit(state, cmd, base)
        if cmd.bundle is None:
            # Its commits come from the bundle it published, never from whatever the refinery's clone holds.
            raise CommandError("invalid", "a polecat's merge request names the bundle `gt done` published (`bundle`)")
    elif cmd.bundle is not None and crew_of_branch(cmd.branch) is None:
        raise CommandError(
            "invalid", "only a polecat session or a crew member publishes a bundle (gt done); submit a branch by hand"
        )
    else:
        check_hand_submit(state, cmd, cmd.target or base, base)
    existing = existing_mr(state, cmd.rig, cmd.bead, cmd.head)
    if existing is not None and existing.status in MR_SENT_BACK:
        return resubmit_failed(existing, cmd)
    if existing is not None:
        return Accepted(result=mr_result(existing))
    mr_id = mr_id_for(cmd.rig, cmd.bead, cmd.head, state.rigs[cmd.rig].incarnation)
    event = MergeRequestSubmitted(
        mr_id=mr_id,
        bead=cmd.bead,
        rig=cmd.rig,
        branch=cmd.branch,
        target=cmd.target or base,
        head=cmd.head,
        priority=cmd.priority,
        session=cmd.session,
        bundle=cmd.bundle,
    )
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=0)],
        result=MrResult(id=mr_id, status="queued", changed=True, bead=cmd.bead, rig=cmd.rig, head=cmd.head),
    )


def resubmit_failed(mr: MergeRequest, cmd: MergeRequestSubmit) -> Accepted[MrResult]:
    """The bead submits again the commit that was sent back (its polecat changed nothing): the merge request is
    its bead's and goes back into the queue, so the bead is never left without one. Gated again, it merges (the
    failure was the target's or flaky) or fails (conflicts) again and goes back to the polecat, until the bead's
    failures (conflicts sent back) reach the limit and it is escalated (goes to the operator). A retried command
    is answered from its stored outcome, not here."""
    by = f" by session {cmd.session}" if cmd.session else ""
    why = "its merge conflicted" if mr.status == "conflicted" else f"its {mr.gate} gate failed"
    event = MergeRequestRequeued(mr_id=mr.id, reason=f"resubmitted unchanged{by} after {why}")
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=mr.version)],
        result=MrResult(id=mr.id, status="queued", changed=True, bead=mr.bead, rig=mr.rig, head=mr.head),
    )


def _known(state: RefineryState, mr_id: str) -> MergeRequest:
    mr = state.mrs.get(mr_id)
    if mr is None:
        raise CommandError("not_found", f"no merge request {mr_id!r} (`gt mq list` shows them)")
    return mr


def retry(state: RefineryState, cmd: MergeRequestRetry) -> Accepted[MrResult]:
    mr = _known(state, cmd.id)
    if of_a_former_rig(state, mr):
        raise CommandError(
            "conflict",
            f"merge request {mr.id} was submitted to rig {mr.rig} before it was removed; the rig added again under "
            "that name is another rig: sling the bead to it for a new merge request",
        )
    if mr.status == "merged":
        raise CommandError("backward_transition", f"merge request {mr.id} is merged already")
    if mr.status in MR_IN_QUEUE:
        return Accepted(result=MrResult(id=mr.id, status=mr.status, changed=False))
    event = MergeRequestRequeued(mr_id=mr.id, reason=f"retried after {mr.status}")
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=mr.version)],
        result=MrResult(id=mr.id, status="queued", changed=True),
    )


def reject(state: RefineryState, cmd: MergeRequestReject) -> Accepted[MrResult]:
    mr = _known(state, cmd.id)
    if mr.status == "merged":
        raise CommandError("backward_transition", f"merge request {mr.id} is merged already")
    if mr.status == "rejected":
        return Accepted(result=MrResult(id=mr.id, status="rejected", changed=False))
    if mr.status == "claimed":
        raise CommandError("conflict", f"merge request {mr.id} is being processed now; reject it once it is done")
    event = MergeRequestRejected(mr_id=mr.id, reason=cmd.reason)
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=mr.version)],
        result=MrResult(id=mr.id, status="rejected", changed=True),
    )


def resume(state: RefineryState, cmd: MergeQueueResume) -> Accepted[MergeQueueResult]:
    """The rig's paused queue goes on, in its order."""
    queue = state.queues.get(cmd.rig)
    if cmd.rig not in state.rigs and queue is None:
        raise CommandError("not_found", f"no rig {cmd.rig!r} (`gt rig list` shows them)")
    if queue is None or not queue.paused:
        return Accepted(result=MergeQueueResult(rig=cmd.rig, paused=False, changed=False))
    return Accepted(
        events=[NewEvent(payload=MergeQueueResumed(rig=cmd.rig), expected_seq=queue.version)],
        result=MergeQueueResult(rig=cmd.rig, paused=False, changed=True, was=queue.reason),
    )
