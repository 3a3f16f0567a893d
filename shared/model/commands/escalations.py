"""Escalation commands (``gt.cmd.escalation.<verb>``), owned by the mayor."""

from __future__ import annotations

from typing import ClassVar

from shared.core.ids import ESCALATION_PREFIX
from shared.model.commands.base import (
    MAX_ACTOR,
    MAX_DESCRIPTION,
    MAX_REASON,
    Command,
    Creates,
    check_choice,
    check_id,
    check_text,
    invalid,
)
from shared.model.results import EscalationResult

SEVERITIES = ("low", "medium", "high", "critical")
RESOLUTIONS = {
    "bead": "the bead is closed",
    "mr": "the merge request merged",
    "rig": "a session of the rig finished its work (ended done) after it was raised",
    "service": "the service is up",
}
"""What an escalation may be resolved by (``resolved_when`` entries ``<kind>:<id>``): the mayor closes it then."""
MAX_RESOLUTIONS = 16


class EscalationRaise(Creates[EscalationResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Ask the operator to look at something; unacknowledged, it is raised a severity after a while."""

    SUBJECT: ClassVar[str] = "gt.cmd.escalation.raise"
    OWNER: ClassVar[str] = "mayor"
    ORDERED_BY = ("escalation", "new_id")
    severity: str
    message: str
    source: str = ""
    """Who or what raised it (default: the command's actor)."""
    bead: str | None = None
    """A bead it is about, if any."""
    resolved_when: list[str] = []
    """What resolves it by itself, any one of them (``bead:<id>`` closed, ``mr:<id>`` merged, ``rig:<name>`` a
    session finished its work there, ``service:<name>`` up): the mayor then closes it, naming which. Empty (an
    operator's own): it stays open until someone closes it."""

    def id_prefix(self) -> str:
        return ESCALATION_PREFIX

    def validate(self) -> None:
        super().validate()
        check_choice("severity", self.severity, SEVERITIES)
        check_text("message", self.message, MAX_DESCRIPTION, nonblank=True)
        check_text("source", self.source, MAX_ACTOR)
        check_id("bead", self.bead)
        check_resolutions(self.resolved_when)


def check_resolutions(entries: list[str]) -> None:
    if len(entries) > MAX_RESOLUTIONS:
        raise invalid(f"`resolved_when` has {len(entries)} entries; the limit is {MAX_RESOLUTIONS}")
    for entry in entries:
        kind, _, what = entry.partition(":")
        if kind not in RESOLUTIONS:
            kinds = ", ".join(f"{k}:<id> ({v})" for k, v in RESOLUTIONS.items())
            raise invalid(f"`resolved_when` entry {entry[:80]!r} must be one of {kinds}")
        check_id(f"resolved_when {kind}", what, required=True)


class EscalationAck(Command[EscalationResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Someone is on it: an acknowledged escalation is not raised further."""

    SUBJECT: ClassVar[str] = "gt.cmd.escalation.ack"
    OWNER: ClassVar[str] = "mayor"
    ORDERED_BY = ("escalation", "id")
    REQUIRED_IDS = ("id",)
    id: str


class EscalationClose(Command[EscalationResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Resolved (closing a closed escalation changes nothing)."""

    SUBJECT: ClassVar[str] = "gt.cmd.escalation.close"
    OWNER: ClassVar[str] = "mayor"
    ORDERED_BY = ("escalation", "id")
    REQUIRED_IDS = ("id",)
    id: str
    reason: str = ""

    def validate(self) -> None:
        super().validate()
        check_text("reason", self.reason, MAX_REASON)


ESCALATION_COMMANDS: tuple[type[Command], ...] = (EscalationRaise, EscalationAck, EscalationClose)
