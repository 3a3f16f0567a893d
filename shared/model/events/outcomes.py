"""Command outcomes (``gt.evt.cmd.<command_id>``; a session's ``gt.evt.cmd.<session>.<command id>``): exactly one per
command, written by its owning service."""

from __future__ import annotations

from typing import ClassVar, Generic

import msgspec

from shared.core import subjects
from shared.model.events.base import Event, EventRef
from shared.model.results import R


class CommandOutcome(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "cmd"
    command_id: str
    command: str
    """The command's subject without ``gt.cmd.``, e.g. ``bead.create``."""

    def aggregate_id(self) -> str:
        return self.command_id

    def subject(self) -> str:
        return subjects.outcome_subject(self.command_id)


class CommandAccepted(CommandOutcome, Generic[R], frozen=True, kw_only=True):
    """The command took effect (or was already in effect: then ``events`` is empty). ``result`` is the command's
    result type (``Command[R]``): decoded as plain JSON where the command is not known (the log's registry), into
    ``CommandAccepted[<its result type>]`` by the sender (``shared.bus.commands``)."""

    TYPE: ClassVar[str] = "cmd.accepted"
    events: list[EventRef] = []
    result: R = msgspec.field(default_factory=dict)  # type: ignore[assignment]

    def created_id(self) -> str | None:
        """The id its result names (what a command that creates something answers), whether the result was read
        as its type or, by a fold that reads every command's outcome, as the JSON the log holds."""
        result: object = self.result
        found = result.get("id") if isinstance(result, dict) else getattr(result, "id", None)
        return found if isinstance(found, str) else None


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
    "gate_closed",
)
