"""What the refinery owes besides processing the queue, recomputed from the state every reconcile: merge requests
whose bead was closed (rejected as stale), blocked ones whose conflict bead was closed (back into the queue), and
merged ones whose bead is still open (its close). Pure."""

from __future__ import annotations

from services.refinery.plan.settle import close_reason
from services.refinery.state import MergeRequest, RefineryState
from shared.model.commands import BeadClose
from shared.model.decision import NewEvent
from shared.model.events import MergeRequestRejected, MergeRequestRequeued


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


def reconciled(state: RefineryState) -> list[NewEvent]:
    """The events owed now: stale merge requests rejected, unblocked ones requeued."""
    owed = [
        NewEvent(payload=MergeRequestRejected(mr_id=mr.id, reason="its bead was closed"), expected_seq=mr.version)
        for mr in stale(state)
    ]
    for mr in unblocked(state):
        reason = f"conflict bead {mr.blocked_by} closed"
        owed.append(NewEvent(payload=MergeRequestRequeued(mr_id=mr.id, reason=reason), expected_seq=mr.version))
    return owed


def bead_close(state: RefineryState, mr: MergeRequest) -> BeadClose:
    """The close of a merged merge request's bead (idempotent by its id: sent again after a crash)."""
    return BeadClose(id=mr.bead, reason=close_reason(state, mr), cmd_id=f"close-{mr.id}")
