"""Which merge requests the refinery works on next. Pure.

Score (Gas Town's): ``1000 + 100 * (4 - priority) + 10 * convoy hours - min(50 * retries, 300) + hours
queued``, where convoy hours is the age of the oldest convoy tracking the bead and retries counts the merge
request's attempts and its bead's failed merge requests; the highest goes first, ties by age. ``fifo`` orders
by queue time alone. One merge request per rig at a time (or one batch of up to ``batch`` of them): a rig whose
merge request is claimed under a live lease waits. A merge request requeued with a ``not_before`` (a push that
did not land, retried with backoff) is not taken before that time. A merge request claimed by a refinery
that stopped acting (killed mid-merge) goes first: its successor resumes the queue where it was.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import msgspec

from services.refinery.plan.policy import Policy
from services.refinery.state import MergeRequest, RefineryState
from shared.core.ids import merge_lease_name
from shared.model.decision import NewEvent
from shared.model.events import MergeRequestClaimed
from shared.model.events.merge_requests import MR_IN_QUEUE


def failures_of(state: RefineryState, bead: str) -> int:
    """Failed gate runs of the bead's merge requests (each is one attempt of the polecat's): a merge request its
    bead resubmitted unchanged counts each time it failed. One that failed counts at least once (a snapshot
    written before ``failures`` was kept has 0 there)."""
    failed = ("failed", "escalated")
    return sum(max(mr.failures, mr.status in failed) for mr in state.mrs.values() if mr.bead == bead)


def score(state: RefineryState, mr: MergeRequest, now: datetime, policy: Policy) -> float:
    if policy.fifo:
        return -mr.queued_at.timestamp()
    hours = max(0.0, (now - mr.queued_at).total_seconds() / 3600)
    bead = state.beads.get(mr.bead)
    since = bead.convoy_since if bead is not None else None
    convoy_hours = max(0.0, (now - since).total_seconds() / 3600) if since is not None else 0.0
    retries = mr.attempts + failures_of(state, mr.bead)
    return 1000 + 100 * (4 - mr.priority) + 10 * convoy_hours - min(50 * retries, 300) + hours


def claimable(mr: MergeRequest, now: datetime, state: RefineryState | None = None, me: str | None = None) -> bool:
    """Queued, or claimed by a refinery whose claim ran out or that no longer holds the rig's merge lease (it
    crashed or hangs, and the deacon expired its lease), or claimed by another refinery than ``me``, the one
    asking: only the active refinery acts, so another claimant is a former instance that stopped acting."""
    if mr.status == "queued":
        return mr.not_before is None or mr.not_before <= now
    if mr.status != "claimed":
        return False
    if me is not None and mr.holder != me:
        return True
    if mr.lease_until is not None and mr.lease_until <= now:
        return True
    lease = state.merge_leases.get(merge_lease_name(mr.rig)) if state is not None else None
    return lease is not None and not (lease.holder == mr.holder and lease.status == "held")


def ready_per_rig(
    state: RefineryState, now: datetime, policy: Policy, busy: frozenset[str], me: str | None = None
) -> dict[str, list[MergeRequest]]:
    """Each idle rig's claimable merge requests, best first (rigs in ``busy`` are being worked here; ``me``:
    the refinery asking, see ``claimable``)."""
    held = {mr.rig for mr in state.mrs.values() if mr.status == "claimed" and not claimable(mr, now, state, me)}
    held |= {rig for rig, queue in state.queues.items() if queue.paused}  # nothing is taken until resumed
    behind = waiting_behind(state)
    ready: dict[str, list[MergeRequest]] = {}
    for mr in state.mrs.values():
        if mr.rig in busy or mr.rig in held or mr.rig not in state.rigs or not claimable(mr, now, state, me):
            continue
        if mr.incarnation != state.rigs[mr.rig].incarnation:
            continue  # submitted to the rig before it was removed and added again: not the new rig's to merge
        if mr.id in behind:
            continue  # another bead's merge request carries the same commit: settled after it
        bead = state.beads.get(mr.bead)
        if bead is not None and bead.status == "closed":
            continue  # owed: rejected as stale (see ``owed.stale``)
        ready.setdefault(mr.rig, []).append(mr)
    for mrs in ready.values():
        mrs.sort(key=lambda m: resume_order(state, m, now, policy), reverse=True)
    return ready


def resume_order(state: RefineryState, mr: MergeRequest, now: datetime, policy: Policy) -> tuple[bool, float, float]:
    """Highest first: a merge request a former refinery held (claimed, taken over) before any other, so a restarted
    refinery resumes the queue where its predecessor was; then by score, then the oldest in the queue."""
    return (mr.status == "claimed", score(state, mr, now, policy), -mr.queued_at.timestamp())


def submitted_order(mr: MergeRequest) -> tuple[datetime, str]:
    return (mr.submitted_at, mr.id)


def waiting_behind(state: RefineryState) -> dict[str, MergeRequest]:
    """Merge requests in the queue whose head commit an earlier merge request of another bead, also still in the
    queue (queued or claimed), carries to the same rig and target: merge request id -> that earlier one.

    Each bead has a merge request of its own, but one commit is landed once: the later one waits until the
    earlier is settled, then is processed as any other. If the commit landed, it finds every commit on the target
    already and is merged ``already`` (its bead closes, naming the one that landed it, see
    ``settle.close_reason``); if not, it is gated on its own and merges or goes back to its polecat. The earliest
    one never waits, so nothing waits forever."""
    first: dict[tuple[str, str, str], MergeRequest] = {}
    for mr in state.mrs.values():
        if mr.status not in MR_IN_QUEUE or _bead_closed(state, mr):
            continue  # a queued one whose bead closed is rejected as stale, not processed: nothing to wait for
        key = (mr.rig, mr.target, mr.head)
        known = first.get(key)
        if known is None or submitted_order(mr) < submitted_order(known):
            first[key] = mr
    out: dict[str, MergeRequest] = {}
    for mr in state.mrs.values():
        leader = first.get((mr.rig, mr.target, mr.head))
        if mr.status in MR_IN_QUEUE and leader is not None and leader.id != mr.id and leader.bead != mr.bead:
            out[mr.id] = leader
    return out


def _bead_closed(state: RefineryState, mr: MergeRequest) -> bool:
    bead = state.beads.get(mr.bead)
    return bead is not None and bead.status == "closed"


def next_per_rig(
    state: RefineryState, now: datetime, policy: Policy, busy: frozenset[str], me: str | None = None
) -> list[MergeRequest]:
    """The merge request each idle rig should process now (serial mode)."""
    return [mrs[0] for _, mrs in sorted(ready_per_rig(state, now, policy, busy, me).items())]


class Batches(msgspec.Struct, frozen=True, kw_only=True):
    batches: list[list[MergeRequest]]
    """Per rig, the merge requests to claim and process together now, in stack order (best first)."""
    wake_at: datetime | None = None
    """When a rig held back to fill its batch must be looked at again."""


def next_batches(
    state: RefineryState, now: datetime, policy: Policy, busy: frozenset[str], me: str | None = None
) -> Batches:
    """Up to ``policy.batch`` merge requests per idle rig and target. A rig with fewer ready than that waits
    until its oldest ready one has waited ``policy.batch_wait_s``, so a burst of submissions lands together."""
    out: list[list[MergeRequest]] = []
    # A merge request waiting out its backoff is looked at again when the wait ends (the time is in the log, so
    # a restarted refinery waits the same).
    waits = [mr.not_before for mr in state.mrs.values() if mr.status == "queued" and mr.not_before is not None]
    wake_at: datetime | None = min((w for w in waits if w > now), default=None)
    for _, mrs in sorted(ready_per_rig(state, now, policy, busy, me).items()):
        # One push lands a batch, so a batch has one target: the best merge request's.
        same_target = [mr for mr in mrs if mr.target == mrs[0].target][: policy.batch]
        if len(same_target) < policy.batch and policy.batch_wait_s > 0:
            due = min(mr.queued_at for mr in same_target) + timedelta(seconds=policy.batch_wait_s)
            if due > now:
                wake_at = due if wake_at is None else min(wake_at, due)
                continue
        out.append(same_target)
    return Batches(batches=out, wake_at=wake_at)


def claims(batch: list[MergeRequest], now: datetime, policy: Policy, holder: str) -> list[NewEvent]:
    """The claims of a batch by ``holder``, each expecting its merge request's version. Bisecting a batch runs the
    gates about log2(size) + 2 times: the claim lasts that many leases."""
    ids = [mr.id for mr in batch] if len(batch) > 1 else []
    lease = policy.lease_s * (1 if len(batch) == 1 else 2 + math.ceil(math.log2(len(batch))))
    return [
        NewEvent(
            payload=MergeRequestClaimed(
                mr_id=mr.id,
                attempt=mr.attempts + 1,
                holder=holder,
                lease_until=now + timedelta(seconds=lease),
                batch=ids,
            ),
            expected_seq=mr.version,
        )
        for mr in batch
    ]
