"""Crew commands (``gt.cmd.crew.<verb>``): a rig's named workspaces, settled by the witness that keeps them
(docs/crew.md). The operator's only: no agent's subjects carry them."""

from __future__ import annotations

from typing import ClassVar

from shared.model.commands.base import Command, ScopeRef, check_id, invalid
from shared.model.crew import CREW_NAME
from shared.model.results import CrewResult


class _CrewCommand(Command[CrewResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    OWNER: ClassVar[str] = "witness"
    ORDERED_BY = ("rig", "rig")
    REQUIRED_IDS: ClassVar[tuple[str, ...]] = ("rig",)
    rig: str
    name: str

    def validate(self) -> None:
        super().validate()
        if not CREW_NAME.fullmatch(self.name):
            raise invalid(
                f"`name` {self.name[:80]!r} is no crew name: 2 to 16 lowercase letters and digits, starting with a "
                "letter (it names a branch, crew/<name>, and a directory)"
            )

    def scope_ref(self) -> ScopeRef | None:
        return ScopeRef("rig", self.rig)


class CrewAdd(_CrewCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Add a crew member to the rig: the witness makes its workspace, a repository of its own on ``crew/<name>``
    from the rig's base branch. Adding one that is there changes nothing."""

    SUBJECT: ClassVar[str] = "gt.cmd.crew.add"


class CrewRemove(_CrewCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Remove a crew member and its workspace: refused while its workspace holds uncommitted changes or commits
    neither on the base branch nor published by its `gt done`, while a bead hooked to it is open, or while a
    session works in it."""

    SUBJECT: ClassVar[str] = "gt.cmd.crew.remove"


class CrewHook(_CrewCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Hook a bead to the crew member: once the bead is slung to the rig, its sessions run in the crew member's
    workspace on its branch (supervised like a polecat's: a dead one is started again at its current step)."""

    SUBJECT: ClassVar[str] = "gt.cmd.crew.hook"
    REQUIRED_IDS = ("rig", "bead")
    bead: str

    def validate(self) -> None:
        super().validate()
        check_id("bead", self.bead, required=True)


CREW_COMMANDS: tuple[type[Command[CrewResult]], ...] = (CrewAdd, CrewRemove, CrewHook)
