"""Escalation commands (``gt.cmd.escalation.<verb>``), owned by the mayor."""

from __future__ import annotations

from typing import ClassVar

from shared.commands.base import MAX_ACTOR, MAX_DESCRIPTION, MAX_REASON, Command, check_choice, check_id, check_text

SEVERITIES = ("low", "medium", "high", "critical")


class EscalationRaise(Command, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Ask the operator to look at something; unacknowledged, it is raised a severity after a while."""

    SUBJECT: ClassVar[str] = "gt.cmd.escalation.raise"
    severity: str
    message: str
    source: str = ""
    """Who or what raised it (default: the command's actor)."""
    bead: str | None = None
    """A bead it is about, if any."""

    def validate(self) -> None:
        super().validate()
        check_choice("severity", self.severity, SEVERITIES)
        check_text("message", self.message, MAX_DESCRIPTION, nonblank=True)
        check_text("source", self.source, MAX_ACTOR)
        check_id("bead", self.bead)


class EscalationAck(Command, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Someone is on it: an acknowledged escalation is not raised further."""

    SUBJECT: ClassVar[str] = "gt.cmd.escalation.ack"
    id: str

    def validate(self) -> None:
        super().validate()
        check_id("id", self.id, required=True)


class EscalationClose(Command, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Resolved (closing a closed escalation changes nothing)."""

    SUBJECT: ClassVar[str] = "gt.cmd.escalation.close"
    id: str
    reason: str = ""

    def validate(self) -> None:
        super().validate()
        check_id("id", self.id, required=True)
        check_text("reason", self.reason, MAX_REASON)


ESCALATION_COMMANDS: tuple[type[Command], ...] = (EscalationRaise, EscalationAck, EscalationClose)
