"""Bead commands (``gt.cmd.bead.<verb>``), owned by the mayor."""

from __future__ import annotations

from typing import ClassVar

from shared.core.ids import PREFIX_PATTERN
from shared.model.commands.base import (
    MAX_ACTOR,
    MAX_DESCRIPTION,
    MAX_REASON,
    MAX_TITLE,
    Command,
    Creates,
    check_id,
    check_ids,
    check_labels,
    check_metadata,
    check_priority,
    check_text,
    check_type,
    check_vars,
    invalid,
)
from shared.model.results import BeadResult, SlingResult
from shared.model.runtimes import RUNTIMES


class BeadCreate(Creates[BeadResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """File a bead, ``new_id`` or an id the mayor draws (``<prefix>-<base36>``); status starts ``open``."""

    SUBJECT: ClassVar[str] = "gt.cmd.bead.create"
    OWNER: ClassVar[str] = "mayor"
    ORDERED_BY = ("bead", "new_id")
    title: str
    type: str = "task"
    priority: int = 2
    description: str = ""
    labels: list[str] = []
    metadata: dict[str, str] = {}
    parent: str | None = None
    needs: list[str] = []
    assignee: str | None = None
    prefix: str = "hq"

    def id_prefix(self) -> str:
        return self.prefix

    def validate(self) -> None:
        super().validate()
        check_text("title", self.title, MAX_TITLE, nonblank=True)
        check_type(self.type)
        check_priority(self.priority)
        check_text("description", self.description, MAX_DESCRIPTION)
        check_labels("labels", self.labels)
        check_metadata("metadata", self.metadata)
        check_id("parent", self.parent)
        check_ids("needs", self.needs)
        check_text("assignee", self.assignee, MAX_ACTOR, nonblank=True)
        if not PREFIX_PATTERN.fullmatch(self.prefix):
            raise invalid(f"`prefix` {self.prefix!r} must match {PREFIX_PATTERN.pattern}")


class BeadUpdate(Command[BeadResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Change a bead's fields. ``labels`` are added, ``remove_labels`` removed, ``metadata`` merged,
    ``needs`` added and ``remove_needs`` removed; ``blocks`` makes the listed beads need this one;
    ``assignee`` or ``parent`` set to "" clears them. ``status`` may only move forward: ``in_progress``
    claims the bead, ``closed`` closes it."""

    SUBJECT: ClassVar[str] = "gt.cmd.bead.update"
    OWNER: ClassVar[str] = "mayor"
    ORDERED_BY = ("bead", "id")
    REQUIRED_IDS = ("id",)
    id: str
    title: str | None = None
    type: str | None = None
    priority: int | None = None
    description: str | None = None
    assignee: str | None = None
    parent: str | None = None
    labels: list[str] = []
    remove_labels: list[str] = []
    metadata: dict[str, str] = {}
    needs: list[str] = []
    remove_needs: list[str] = []
    blocks: list[str] = []
    status: str | None = None

    def validate(self) -> None:
        super().validate()
        check_text("title", self.title, MAX_TITLE, nonblank=True)
        if self.type is not None:
            check_type(self.type)
        check_priority(self.priority)
        check_text("description", self.description, MAX_DESCRIPTION)
        check_text("assignee", self.assignee, MAX_ACTOR)
        if self.parent:
            check_id("parent", self.parent)
        check_labels("labels", self.labels)
        check_labels("remove_labels", self.remove_labels)
        check_metadata("metadata", self.metadata)
        check_ids("needs", self.needs)
        check_ids("remove_needs", self.remove_needs)
        check_ids("blocks", self.blocks)


class BeadClaim(Command[BeadResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Take a bead for ``assignee``: open or hooked -> in_progress."""

    SUBJECT: ClassVar[str] = "gt.cmd.bead.claim"
    OWNER: ClassVar[str] = "mayor"
    ORDERED_BY = ("bead", "id")
    REQUIRED_IDS = ("id",)
    id: str
    assignee: str

    def validate(self) -> None:
        super().validate()
        check_text("assignee", self.assignee, MAX_ACTOR, nonblank=True)

    def worked_bead(self) -> str | None:
        return self.id


class BeadClose(Command[BeadResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Close a bead. Closing a closed bead succeeds and changes nothing."""

    SUBJECT: ClassVar[str] = "gt.cmd.bead.close"
    OWNER: ClassVar[str] = "mayor"
    ORDERED_BY = ("bead", "id")
    REQUIRED_IDS = ("id",)
    id: str
    reason: str = ""

    def validate(self) -> None:
        super().validate()
        check_text("reason", self.reason, MAX_REASON)


class BeadSling(Command[SlingResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Hook a bead to a rig with a molecule cooked from ``formula`` (default ``polecat-work``).

    Slinging a hooked or in-progress bead again is a conflict unless ``force`` (the witness's re-sling),
    which moves the hook and keeps the molecule with every done step."""

    SUBJECT: ClassVar[str] = "gt.cmd.bead.sling"
    OWNER: ClassVar[str] = "mayor"
    ORDERED_BY = ("bead", "id")
    REQUIRED_IDS = ("id", "rig")
    id: str
    rig: str
    formula: str | None = None
    """Formula to cook onto the bead; None: the default formula."""
    vars: dict[str, str] = {}
    no_formula: bool = False
    """Hook the bead without a molecule."""
    no_convoy: bool = False
    """Do not create the auto-convoy that tracks the bead."""
    owned: bool = False
    """Make the auto-convoy owned: it closes only when landed."""
    force: bool = False
    """Re-sling a hooked or in-progress bead (the witness does, after its session died), or sling an open bead
    past its open blockers (refused ``blocked`` otherwise); the event records the blockers it went past."""
    session: str | None = None
    """The session the hook moves to, when the witness knows it already."""
    hold: bool = False
    """An open bead with open blockers is held instead of refused: its molecule is cooked now, and the mayor
    slings it once every blocker is closed (what `gt convoy sling` sends)."""
    agent: str | None = None
    """The agent runtime every session of the bead runs instead of the rig's ``agent_command``: a name in
    ``shared.model.runtimes.RUNTIMES``. The bead keeps it (respawns, handoffs, rework, later slings that name none);
    a later sling naming another changes it for the bead's next session. None: what an earlier sling chose, else
    the rig's."""

    def validate(self) -> None:
        super().validate()
        check_id("formula", self.formula)
        check_vars("vars", self.vars)
        check_id("session", self.session)
        check_runtime("agent", self.agent)
        if self.no_formula and (self.formula or self.vars):
            raise invalid("`no_formula` cannot go with `formula` or `vars`")
        if self.hold and self.force:
            raise invalid("`hold` waits for the blockers and `force` goes past them: give one of them")


def check_runtime(field: str, name: str | None) -> None:
    """An agent runtime's name, nothing else: a command line of one's own is a rig's setting (``rig.add``), made
    once where the rig is configured, not carried by each sling (which automations and scripts send too)."""
    if name is not None and name not in RUNTIMES:
        raise invalid(
            f"`{field}` {name[:80]!r} is not an agent runtime; the runtimes: {', '.join(sorted(RUNTIMES))} "
            "(a command line of your own is a rig's agent: `gt rig add --agent`)"
        )


class BeadUnsling(Command[SlingResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Release a hooked or in-progress bead's hook: it is open again, its molecule keeps every done step, and
    the witness ends a session working it (as ``unslung``, no death). The worktree and branch stay for the next
    sling unless ``remove_worktree`` (a worktree holding unsaved work is kept anyway, and says so)."""

    SUBJECT: ClassVar[str] = "gt.cmd.bead.unsling"
    OWNER: ClassVar[str] = "mayor"
    ORDERED_BY = ("bead", "id")
    REQUIRED_IDS = ("id",)
    id: str
    reason: str = ""
    remove_worktree: bool = False

    def validate(self) -> None:
        super().validate()
        check_text("reason", self.reason, MAX_REASON)


BEAD_COMMANDS: tuple[type[Command], ...] = (BeadCreate, BeadUpdate, BeadClaim, BeadClose, BeadSling, BeadUnsling)
