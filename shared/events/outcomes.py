"""Command outcomes (``gt.evt.cmd.<command_id>``): exactly one per command, written by its owning service."""

from __future__ import annotations

from typing import Any, ClassVar

from shared.events.base import Event, EventRef


class CommandOutcome(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "cmd"
    command_id: str
    command: str
    """The command's subject without ``gt.cmd.``, e.g. ``bead.create``."""

    def aggregate_id(self) -> str:
        return self.command_id


class CommandAccepted(CommandOutcome, frozen=True, kw_only=True):
    """The command took effect (or was already in effect: then ``events`` is empty)."""

    TYPE: ClassVar[str] = "cmd.accepted"
    events: list[EventRef] = []
    result: dict[str, Any] = {}


class CommandRejected(CommandOutcome, frozen=True, kw_only=True):
    """The command changed nothing. ``code`` is a reason code; ``message`` says what to do about it."""

    TYPE: ClassVar[str] = "cmd.rejected"
    code: str
    message: str


OUTCOME_EVENTS: tuple[type[Event], ...] = (CommandAccepted, CommandRejected)

REJECTION_CODES = (
    "malformed",
    "invalid",
    "unknown_command",
    "not_found",
    "backward_transition",
    "conflict",
    "blocked",
    "too_large",
    "unauthorized",
    "rate_limited",
    "set_aside",
)
