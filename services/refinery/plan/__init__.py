"""What the refinery owes, decided from its state, the policy and the time. Pure.

``queue`` (which merge requests go next, by score, and their claims), ``settle`` (what an outcome of processing
settles: events and follow-up commands), ``pauses`` (a rig's queue paused as a whole), ``owed`` (what every
reconcile owes besides: stale and unblocked merge requests, beads to close), ``policy``, and the vocabulary they
read: ``outcomes`` (what the merger answers) and ``refusals`` (what git's refusal of a push means)."""

from services.refinery.plan.outcomes import BatchResult, GateResult, Outcome, TargetFailed
from services.refinery.plan.owed import bead_close, beads_to_close, reconciled, stale, unblocked
from services.refinery.plan.pauses import TargetFailure, escalation, pause, paused_queues, target_failed
from services.refinery.plan.policy import Policy, policy_of
from services.refinery.plan.queue import (
    Batches,
    claimable,
    claims,
    failures_of,
    next_batches,
    next_per_rig,
    ready_per_rig,
    resume_order,
    score,
    submitted_order,
    waiting_behind,
)
from services.refinery.plan.settle import (
    LogLine,
    Settlement,
    close_reason,
    landed_with,
    processing_failed,
    retry_at,
    send_conflict_back,
    settle,
    target_failing,
)

__all__ = [
    "BatchResult",
    "Batches",
    "GateResult",
    "LogLine",
    "Outcome",
    "Policy",
    "Settlement",
    "TargetFailed",
    "TargetFailure",
    "bead_close",
    "beads_to_close",
    "claimable",
    "claims",
    "close_reason",
    "escalation",
    "failures_of",
    "landed_with",
    "next_batches",
    "next_per_rig",
    "pause",
    "paused_queues",
    "policy_of",
    "processing_failed",
    "ready_per_rig",
    "reconciled",
    "resume_order",
    "retry_at",
    "score",
    "send_conflict_back",
    "settle",
    "stale",
    "submitted_order",
    "target_failed",
    "target_failing",
    "unblocked",
    "waiting_behind",
]
