"""Automation commands (owner: deacon)."""

from __future__ import annotations

from typing import ClassVar

from shared.model.commands.base import Command
from shared.model.results import AutomationRunResult


class AutomationRun(Command[AutomationRunResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Fire the automation ``name`` now, whatever its gate (the manual gate's only way to fire); refused
    while a run of it is still open. Accepted with the new run's id."""

    SUBJECT: ClassVar[str] = "gt.cmd.automation.run"
    OWNER: ClassVar[str] = "deacon"
    ORDERED_BY = ("automation", "name")
    REQUIRED_IDS = ("name",)
    name: str


AUTOMATION_COMMANDS: tuple[type[Command], ...] = (AutomationRun,)
