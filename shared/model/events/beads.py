"""Events of the bead aggregate (``gt.evt.bead.<id>``), written by the mayor."""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from shared.model.events.base import Event

BeadStatus = Literal["open", "hooked", "in_progress", "closed"]
BEAD_STATUSES: tuple[BeadStatus, ...] = ("open", "hooked", "in_progress", "closed")
"""A bead's statuses in the order its events move it: created open, slung (hooked), claimed (in progress),
closed. Only ``bead.unslung`` moves one back (to open)."""
WORKING: tuple[BeadStatus, ...] = ("hooked", "in_progress")
"""On a rig's hook: slung, or claimed by the polecat working it."""
BEAD_RANK: dict[str, int] = {status: rank for rank, status in enumerate(BEAD_STATUSES)}
"""A status's place in that order (a status that is no bead's is not in it)."""

WORK_TYPES = ("task", "bug", "feature", "chore", "docs", "epic")
"""Types of beads that are work: offered by ``ready`` and slung to rigs."""
INFRA_TYPES = frozenset(
    {"molecule", "wisp", "message", "gate", "merge-request", "session", "agent", "role", "rig", "convoy", "escalation"}
)
"""Types that are plumbing, not work: never offered by ``ready`` and never slung."""
BEAD_TYPES = (*WORK_TYPES, *sorted(INFRA_TYPES))
"""Every type a bead may be created with or changed to; a command naming another is refused ``invalid``."""


def forward(status: BeadStatus, to: BeadStatus) -> BeadStatus:
    """A bead's status after an event that moves it forward to ``to`` (sling, claim): a bead already as far or
    further (claimed before it was slung, closed) stays where it is."""
    return to if BEAD_RANK[status] < BEAD_RANK[to] else status


class BeadEvent(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "bead"
    bead_id: str

    def aggregate_id(self) -> str:
        return self.bead_id


class BeadCreated(BeadEvent, frozen=True, kw_only=True):
    """A bead was filed; it starts ``open``."""

    TYPE: ClassVar[str] = "bead.created"
    title: str
    type: str = "task"
    priority: int = 2
    description: str = ""
    labels: list[str] = []
    metadata: dict[str, str] = {}
    parent: str | None = None
    needs: list[str] = []
    assignee: str | None = None


class BeadUpdated(BeadEvent, frozen=True, kw_only=True):
    """Only the fields present changed. ``add_labels`` appends; ``metadata`` merges; ``add_needs`` appends."""

    TYPE: ClassVar[str] = "bead.updated"
    title: str | msgspec.UnsetType = msgspec.UNSET
    type: str | msgspec.UnsetType = msgspec.UNSET
    priority: int | msgspec.UnsetType = msgspec.UNSET
    description: str | msgspec.UnsetType = msgspec.UNSET
    assignee: str | msgspec.UnsetType | None = msgspec.UNSET
    parent: str | msgspec.UnsetType | None = msgspec.UNSET
    add_labels: list[str] = []
    remove_labels: list[str] = []
    metadata: dict[str, str] = {}
    add_needs: list[str] = []
    remove_needs: list[str] = []


class BeadClaimed(BeadEvent, frozen=True, kw_only=True):
    """The bead moved to ``in_progress`` for ``assignee``."""

    TYPE: ClassVar[str] = "bead.claimed"
    assignee: str


class BeadClosed(BeadEvent, frozen=True, kw_only=True):
    """The bead is done for good; follow-up work is a new bead."""

    TYPE: ClassVar[str] = "bead.closed"
    reason: str = ""


class BeadSlung(BeadEvent, frozen=True, kw_only=True):
    """The bead is hooked to ``rig`` (open -> hooked); a forced re-sling moves the hook and keeps the status."""

    TYPE: ClassVar[str] = "bead.slung"
    rig: str
    session: str | None = None
    forced: bool = False
    """A forced sling: a re-sling that moves the hook, or a sling past open blockers (``ignored_blockers``)."""
    convoy_id: str | None = None
    """The auto-convoy created with it, if any."""
    ignored_blockers: list[str] = []
    """The open blockers a forced sling went past (the bead was not ready)."""
    held_for: list[str] = []
    """Set when the mayor slung a held bead once its blockers closed: the blockers it was held for."""
    agent: str | None = None
    """The agent runtime the bead's sessions run from this sling on, in place of the rig's ``agent_command``: the
    one this sling names (``gt sling --agent``), else the one an earlier sling of the bead chose, carried on by the
    mayor. None: the rig's (no sling of the bead named one; every sling in a log from before the field)."""


class BeadHeld(BeadEvent, frozen=True, kw_only=True):
    """A sling with ``hold`` met open blockers: the bead stays open, and the mayor slings it to ``rig``
    (``bead.slung`` with ``held_for``) once every bead it needs is closed. A sling or a close ends the hold."""

    TYPE: ClassVar[str] = "bead.held"
    rig: str
    blockers: list[str] = []
    """The blockers that were open when it was held."""
    agent: str | None = None
    """The agent runtime the bead's sessions are to run (as ``bead.slung``'s ``agent``, which the mayor's sling of the
    held bead carries)."""


class BeadUnslung(BeadEvent, frozen=True, kw_only=True):
    """An operator released the bead's hook (``gt unsling``): hooked or in_progress -> open, off ``rig``.

    Not a step back in the work: the molecule keeps every done step (a later sling resumes at the first step
    not done) and the session on the hook ends as ``unslung``, which is no death. Only the hook is given back, and
    with it a claim: an in_progress bead loses the assignee its claim set."""

    TYPE: ClassVar[str] = "bead.unslung"
    rig: str
    """The rig it was hooked to."""
    reason: str = ""
    remove_worktree: bool = False
    """The operator asked for the last session's worktree to go (kept anyway when it holds unsaved work)."""


BEAD_EVENTS: tuple[type[Event], ...] = (
    BeadCreated,
    BeadUpdated,
    BeadClaimed,
    BeadClosed,
    BeadSlung,
    BeadHeld,
    BeadUnslung,
)
