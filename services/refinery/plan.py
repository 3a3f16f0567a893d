"""Which merge request the refinery works on next, and what it owes besides. Pure.

Score (Gas Town's, without convoy age): ``1000 + 100 * (4 - priority) - min(50 * failures, 300) + hours
queued``; the highest goes first, ties by age. ``fifo`` orders by queue time alone. One merge request per rig
at a time: a rig whose merge request is claimed under a live lease waits.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from services.refinery.state import MergeRequest, RefineryState


class Policy(msgspec.Struct, frozen=True, kw_only=True):
    lease_s: float = 900.0
    max_failures: int = 3
    fifo: bool = False


def failures_of(state: RefineryState, bead: str) -> int:
    """Merge requests of the bead that failed their gates (each is one attempt of the polecat's)."""
    return sum(1 for mr in state.mrs.values() if mr.bead == bead and mr.status in ("failed", "escalated"))


def score(state: RefineryState, mr: MergeRequest, now: datetime, policy: Policy) -> float:
    if policy.fifo:
        return -mr.queued_at.timestamp()
    hours = max(0.0, (now - mr.queued_at).total_seconds() / 3600)
    retries = mr.attempts + failures_of(state, mr.bead)
    return 1000 + 100 * (4 - mr.priority) - min(50 * retries, 300) + hours


def claimable(mr: MergeRequest, now: datetime) -> bool:
    """Queued, or claimed by a refinery whose lease ran out (it crashed or hangs)."""
    return mr.status == "queued" or (mr.status == "claimed" and mr.lease_until is not None and mr.lease_until <= now)


def next_per_rig(state: RefineryState, now: datetime, policy: Policy, busy: frozenset[str]) -> list[MergeRequest]:
    """The merge request each idle rig should process now (rigs in ``busy`` are being worked here)."""
    held = {mr.rig for mr in state.mrs.values() if mr.status == "claimed" and not claimable(mr, now)}
    best: dict[str, MergeRequest] = {}
    for mr in state.mrs.values():
        if mr.rig in busy or mr.rig in held or mr.rig not in state.rigs or not claimable(mr, now):
            continue
        bead = state.beads.get(mr.bead)
        if bead is not None and bead.status == "closed":
            continue  # owed: rejected as stale (see ``stale``)
        current = best.get(mr.rig)
        if current is None or (score(state, mr, now, policy), -mr.queued_at.timestamp()) > (
            score(state, current, now, policy),
            -current.queued_at.timestamp(),
        ):
            best[mr.rig] = mr
    return sorted(best.values(), key=lambda m: m.rig)


def unblocked(state: RefineryState) -> list[MergeRequest]:
    """Blocked merge requests whose conflict bead was closed: back into the queue."""
    out = []
    for mr in state.mrs.values():
        if mr.status == "blocked" and mr.blocked_by is not None:
            blocker = state.beads.get(mr.blocked_by)
            if blocker is not None and blocker.status == "closed":
                out.append(mr)
    return out


def beads_to_close(state: RefineryState) -> list[MergeRequest]:
    """Merged merge requests whose bead is still open (a crash between the merge and the close)."""
    out = []
    for mr in state.mrs.values():
        bead = state.beads.get(mr.bead)
        if mr.status == "merged" and bead is not None and bead.status != "closed":
            out.append(mr)
    return out


def stale(state: RefineryState) -> list[MergeRequest]:
    """Queued merge requests whose bead was closed meanwhile: nothing to merge any more."""
    out = []
    for mr in state.mrs.values():
        bead = state.beads.get(mr.bead)
        if mr.status == "queued" and bead is not None and bead.status == "closed":
            out.append(mr)
    return out
