"""Events of the merge request aggregate (``gt.evt.mr.<id>``), written by the refinery."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from shared.model.events.base import Event

MrStatus = Literal["queued", "claimed", "blocked", "conflicted", "failed", "escalated", "rejected", "merged"]
MR_STATUSES: tuple[MrStatus, ...] = (
    "queued", "claimed", "blocked", "conflicted", "failed", "escalated", "rejected", "merged"
)  # fmt: skip
"""queued -> claimed -> merged; or conflicted (a conflict sent back to the polecat), blocked (a conflict for the
operator), failed (gates; back to the polecat), escalated (failed too often), rejected (by an operator)."""
MR_IN_QUEUE: tuple[MrStatus, ...] = ("queued", "claimed")
"""In its rig's merge queue: waiting, or being merged now (what the refinery takes and orders)."""
MR_OPEN: tuple[MrStatus, ...] = ("queued", "claimed", "blocked", "conflicted", "failed", "escalated")
"""Not settled yet (neither merged nor rejected): in the queue, or waiting for its polecat or an operator (what a
town's overview counts as open)."""
MR_FINISHED: tuple[MrStatus, ...] = ("merged", "failed", "escalated", "rejected", "conflicted")
"""Statuses a merge request stays in unless someone retries it; once its bead is closed nothing moves it any more
(a closed bead takes no new submissions, and a retried one is rejected again as stale), so garbage collection
may drop it."""
MR_SENT_BACK: tuple[MrStatus, ...] = ("failed", "conflicted")
"""Went back to its bead's polecat: failed gates, or a conflict sent back to resolve."""


class MergeRequestEvent(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "mr"
    mr_id: str

    def aggregate_id(self) -> str:
        return self.mr_id


class MergeRequestSubmitted(MergeRequestEvent, frozen=True, kw_only=True):
    """A branch waits in its rig's merge queue. The id derives from the rig, the bead and the head commit: the
    same bead and commit submitted twice is one merge request, two beads at one commit have one each (merge
    requests of logs written before were keyed on rig and head; their ids are kept as they are)."""

    TYPE: ClassVar[str] = "mr.submitted"
    bead: str
    rig: str
    branch: str
    target: str
    head: str
    priority: int = 2
    session: str | None = None
    bundle: str | None = None
    """Where the session published the branch (a bundle the refinery imported when it took the request: its
    commits are in the refinery's clone, the head pinned); None: the branch is in the rig's repository."""


class MergeRequestClaimed(MergeRequestEvent, frozen=True, kw_only=True):
    """The refinery works on it now; another refinery may take it again once ``lease_until`` passed."""

    TYPE: ClassVar[str] = "mr.claimed"
    attempt: int
    holder: str
    lease_until: datetime
    batch: list[str] = []
    """Batch mode: every merge request claimed to be stacked and gated together with this one, in stack
    order (empty when processed alone)."""


class MergeRequestConflicted(MergeRequestEvent, frozen=True, kw_only=True):
    """The branch does not rebase cleanly onto the target. Sent back (``sent_back``): the bead's agent gets a
    fresh session told to rebase onto ``target_commit`` and resolve, and submits again (a new merge request);
    this one is finished (``conflicted``). Otherwise (too many conflicts sent back already, or no agent to send
    it to): a conflict bead for the operator (created by ``conflict_command``) blocks it until closed."""

    TYPE: ClassVar[str] = "mr.conflicted"
    target_commit: str
    conflict_command: str
    """Empty when sent back."""
    files: list[str] = []
    sent_back: bool = False


class MergeRequestFailed(MergeRequestEvent, frozen=True, kw_only=True):
    """A gate failed on the rebased branch (and not on the target): the work goes back to the polecat, or is
    escalated after too many failures."""

    TYPE: ClassVar[str] = "mr.failed"
    gate: str
    """setup, lint, test, branch (the branch or commit is gone), push (git refused the push to the target; ``tail``
    holds git's message) or error (processing kept failing)."""
    exit_code: int
    tail: str = ""
    escalated: bool = False


class MergeRequestMerged(MergeRequestEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "mr.merged"
    merged_commit: str
    """The target's head after the merge (the tested commit)."""
    target_before: str
    gates_run: int = 0
    """Gate commands run for the batch it landed with (once per batch, not per merge request)."""
    gate_seconds: float = 0.0
    """Time those gate commands took."""
    batch: list[str] = []
    """Batch mode: the merge requests that landed with the same push, in stack order."""
    already: bool = False
    """The target held the change already (a crash after the push): nothing was pushed this time."""
    bug_bead_command: str | None = None
    """A gate failed on the target too: a bug bead was filed (by this command) and the change merged anyway."""
    flaky: list[str] = []
    """Gates that failed on this merge request's candidate and passed when run once more (``GT_MQ_RETRY_RED``):
    flaky, not blamed."""


class MergeRequestRequeued(MergeRequestEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "mr.requeued"
    reason: str
    retries: int = 0
    """Requeues in a row after a push that did not land (the target moved, the repository was unreachable) or a
    processing error, this one included; 0 for any other requeue (a retry by hand starts the count again)."""
    not_before: datetime | None = None
    """The refinery does not take it again before this time (backoff; None: at once)."""


class MergeRequestRejected(MergeRequestEvent, frozen=True, kw_only=True):
    """Taken out of the queue for good by an operator."""

    TYPE: ClassVar[str] = "mr.rejected"
    reason: str = ""


MERGE_REQUEST_EVENTS: tuple[type[Event], ...] = (
    MergeRequestSubmitted,
    MergeRequestClaimed,
    MergeRequestConflicted,
    MergeRequestFailed,
    MergeRequestMerged,
    MergeRequestRequeued,
    MergeRequestRejected,
)
