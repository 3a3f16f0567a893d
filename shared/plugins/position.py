"""Where a plugin's durable consumer should deliver from when the plugin starts. Pure.

The SDK hands events to the handler in stream order. A consumer that still holds unacknowledged events
from a previous run (the process died mid-batch) would redeliver them only after their ack wait, behind
newer ones; so such a consumer is recreated to start at its ack floor, and everything the dead process
had not acknowledged comes first, in order, at once.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Action = Literal["keep", "create", "recreate"]


class ConsumerPosition(NamedTuple):
    """What the server says about an existing consumer."""

    delivered_seq: int
    """Stream sequence of the last event it delivered."""
    ack_floor_seq: int
    """Stream sequence up to which every event was acknowledged."""
    ack_pending: int
    """Delivered events not acknowledged yet."""
    subjects: tuple[str, ...]


class StartPlan(NamedTuple):
    action: Action
    start_seq: int
    """First stream sequence to deliver (1: the whole log); unused when the consumer is kept."""
    reason: str


def plan_start(
    existing: ConsumerPosition | None,
    *,
    subjects: tuple[str, ...],
    replay: bool,
    resume_after: int | None,
) -> StartPlan:
    """Decide whether to keep, create or recreate the consumer, and from which sequence.

    ``resume_after`` is the last sequence the plugin holds by its own records (the archiver's files), or
    None when the consumer's position is the only record.
    """

    def make(start_seq: int, reason: str) -> StartPlan:
        return StartPlan("create" if existing is None else "recreate", max(1, start_seq), reason)

    if replay:
        return make(1, "replay_from_start")
    if resume_after is not None:
        if resume_after < 0:
            raise ValueError(f"resume_after must be a stream sequence (0 or more), got {resume_after}")
        if (
            existing is not None
            and existing.delivered_seq == resume_after
            and existing.ack_pending == 0
            and sorted(existing.subjects) == sorted(subjects)
        ):
            return StartPlan("keep", 0, "at_plugin_record")
        return make(resume_after + 1, "plugin_record")
    if existing is None:
        return make(1, "new")
    if existing.ack_pending > 0:
        return make(existing.ack_floor_seq + 1, "unacknowledged_from_previous_run")
    if sorted(existing.subjects) != sorted(subjects):
        # A changed filter applies from where the plugin stands; a replay shows older events too.
        return make(existing.delivered_seq + 1, "subjects_changed")
    return StartPlan("keep", 0, "resume")
