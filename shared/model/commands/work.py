"""Molecule step commands (``gt.cmd.step.<verb>``) and their gates' (``gt.cmd.gate.<verb>``), owned by the mayor."""

from __future__ import annotations

from typing import ClassVar

from shared.model.commands.base import MAX_REASON, Command, check_text
from shared.model.results import GateResult, StepResult


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


class _GateCommand(Command[GateResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    ORDERED_BY = ("bead", "bead")
    REQUIRED_IDS = ("bead", "step")
    bead: str
    """The bead whose molecule holds the gated step."""
    step: str
    """The gated step's id (the formula's step with a ``wait``)."""

    def worked_bead(self) -> str | None:
        return self.bead


class GateApprove(_GateCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """(an operator) Open a step's gate: a ``human`` gate's answer, or any gate opened early by hand. Approving an
    open gate changes nothing."""

    SUBJECT: ClassVar[str] = "gt.cmd.gate.approve"
    OWNER: ClassVar[str] = "mayor"
    note: str = ""
    """Kept with the opening (``step.gate_opened``'s ``detail``): what the operator decided, for the agent."""

    def validate(self) -> None:
        super().validate()
        check_text("note", self.note, MAX_REASON)


class GateOpen(_GateCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """(the deacon) A ``ci`` gate's command exited 0: its gate opens. Operators approve with ``gate.approve``
    (their NATS user may not send this one: ops/nats/accounts.conf)."""

    SUBJECT: ClassVar[str] = "gt.cmd.gate.open"
    OWNER: ClassVar[str] = "mayor"
    output: str = ""
    """The tail of the command's output."""

    def validate(self) -> None:
        super().validate()
        check_text("output", self.output, MAX_REASON)


STEP_COMMANDS: tuple[type[Command], ...] = (StepStart, StepDone, GateApprove, GateOpen)
