"""A merge request as the refinery keeps it and shows it: one class is the record of its projection and the answer
of ``gt.q.refinery.mrs`` and ``mr``. Pure data."""

from __future__ import annotations

from datetime import datetime

import msgspec

from shared.model.events.merge_requests import MrStatus


class MergeRequest(msgspec.Struct, kw_only=True, gc=False):
    id: str
    bead: str
    rig: str
    branch: str
    target: str
    head: str
    priority: int = 2
    session: str | None = None
    bundle: str | None = None
    """The session's published bundle, imported when the request was taken: its head is merged as submitted."""
    status: MrStatus = "queued"
    """queued -> claimed -> merged; or conflicted (a conflict sent back to the polecat), blocked (a conflict
    for the operator), failed (gates; back to the polecat), escalated (failed too often), rejected (by an
    operator). Conflicted, blocked, failed and rejected ones can be retried."""
    submitted_at: datetime
    queued_at: datetime
    """When it last entered the queue (submitted, requeued or retried): the age in its score."""
    attempts: int = 0
    failures: int = 0
    """Times its gates failed (it is gated again when its bead resubmits the same commit)."""
    holder: str | None = None
    lease_until: datetime | None = None
    conflict_command: str | None = None
    blocked_by: str | None = None
    """The conflict bead, once its create command's outcome is in the log."""
    gate: str | None = None
    exit_code: int | None = None
    tail: str = ""
    merged_commit: str | None = None
    already: bool = False
    """Merged, and every commit of it was on the target already (nothing was pushed for it)."""
    batch: list[str] = []
    """The merge requests it was last claimed (then merged) together with, in stack order."""
    bug_bead_command: str | None = None
    reason: str = ""
    retries: int = 0
    """Requeues in a row after a push that did not land or a processing error (reset when retried by hand)."""
    not_before: datetime | None = None
    """Not taken from the queue before this time (the backoff of its last such requeue)."""
    ended_at: datetime | None = None
    """When it was last merged, failed or rejected (None while queued, claimed or blocked)."""
    incarnation: int = 1
    """The incarnation of its rig it was submitted to (``Rig.incarnation``): one of a rig since removed and added
    again is never merged into the new one."""
    version: int = 0
