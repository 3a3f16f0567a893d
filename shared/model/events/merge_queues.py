"""Events of a rig's merge queue as a whole (``gt.evt.mq.<rig>``), written by the refinery: the queue paused
because its target cannot take any merge (a push refusal that is the target's, not the change's; a gate that
fails on the target itself), and resumed by the operator. Being in the log, a pause survives restarts and every
reader sees the same queue."""

from __future__ import annotations

from typing import ClassVar

from shared.model.events.base import Event

PUSH_REFUSED = "push_refused"
"""The target refused a push for a reason of its own (a checked-out branch with changes, a permission)."""
GATE_BROKEN = "gate_broken"
"""A gate failed on the target's tip twice in a row (a broken gate command, a missing tool, a broken target)."""
PAUSE_CAUSES = (PUSH_REFUSED, GATE_BROKEN)


class MergeQueueEvent(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "mq"
    rig: str

    def aggregate_id(self) -> str:
        return self.rig


class MergeQueuePaused(MergeQueueEvent, frozen=True, kw_only=True):
    """The rig's queue takes no merge request until resumed (``gt mq resume <rig>``): what is queued stays
    queued, in its order; the merge requests that met the cause went back into it."""

    TYPE: ClassVar[str] = "mq.paused"
    cause: str
    """One of ``PAUSE_CAUSES``."""
    reason: str
    """What is wrong and what to do about it, for a person."""
    mr_id: str
    """The merge request that met it."""
    detail: str = ""
    """git's message, or the failing gate's output tail."""


class MergeQueueResumed(MergeQueueEvent, frozen=True, kw_only=True):
    """The operator resumed the rig's queue: it goes on in its order."""

    TYPE: ClassVar[str] = "mq.resumed"


class MergeQueueTargetFailed(MergeQueueEvent, frozen=True, kw_only=True):
    """A gate that failed on a merge request failed on the target's tip too: nobody is blamed, nothing merges
    ungated. The merge requests go back into the queue; the second such failure in a row pauses the queue."""

    TYPE: ClassVar[str] = "mq.target_failed"
    gate: str
    target: str
    commit: str
    """The target's tip it failed on."""
    exit_code: int
    tail: str = ""
    in_a_row: int = 1
    """Failures on the target in a row, this one included (since the last merge or resume of the queue)."""


MERGE_QUEUE_EVENTS: tuple[type[Event], ...] = (MergeQueuePaused, MergeQueueResumed, MergeQueueTargetFailed)
