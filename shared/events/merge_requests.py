"""Events of the merge request aggregate (``gt.evt.mr.<id>``), written by the refinery."""

from __future__ import annotations

from typing import ClassVar

from shared.events.base import Event


class MergeRequestEvent(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "mr"
    mr_id: str

    def aggregate_id(self) -> str:
        return self.mr_id


class MergeRequestSubmitted(MergeRequestEvent, frozen=True, kw_only=True):
    """A branch waits in its rig's merge queue. The id derives from the head commit: the same commit
    submitted twice is one merge request."""

    TYPE: ClassVar[str] = "mr.submitted"
    bead: str
    rig: str
    branch: str
    target: str
    head: str
    priority: int = 2
    session: str | None = None


MERGE_REQUEST_EVENTS: tuple[type[Event], ...] = (MergeRequestSubmitted,)
