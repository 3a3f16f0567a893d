"""Molecule step commands (``gt.cmd.step.<verb>``), owned by the mayor."""

from __future__ import annotations

from typing import ClassVar

from shared.model.commands.base import Command
from shared.model.results import StepResult


class _StepCommand(Command[StepResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    ORDERED_BY = ("bead", "bead")  # a step and a sling of the same bead touch the same molecule
    REQUIRED_IDS = ("bead", "step")
    bead: str
    """The bead whose molecule holds the step."""
    step: str
    """The step's id in the molecule."""

    def worked_bead(self) -> str | None:
        return self.bead


class StepStart(_StepCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """pending -> in_progress (its needs must be done); starting a started step changes nothing."""

    SUBJECT: ClassVar[str] = "gt.cmd.step.start"
    OWNER: ClassVar[str] = "mayor"


class StepDone(_StepCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """pending or in_progress -> done (its needs must be done); completing a done step changes nothing."""

    SUBJECT: ClassVar[str] = "gt.cmd.step.done"
    OWNER: ClassVar[str] = "mayor"


STEP_COMMANDS: tuple[type[Command], ...] = (StepStart, StepDone)
