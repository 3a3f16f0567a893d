"""What a decide function gets and returns: the events a command produces and the result the operator sees."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, Literal

from shared.model.events import Event
from shared.model.results import R


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append. ``expected_seq`` is the aggregate's version the decision was based on (0: the
    aggregate must not exist yet; None: no check, only for a later event on a subject the same decision
    already checked)."""

    payload: Event
    expected_seq: int | None


@dataclass(frozen=True, slots=True)
class Accepted(Generic[R]):
    """A command's effect: the operator's ``result`` (the command's result type, ``Command[R]``) and the events to
    append (none when already in effect)."""

    result: R
    events: list[NewEvent] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class DecideContext:
    """Time and id sources handed to pure decide functions (they read no clock and draw no randomness)."""

    now: datetime
    command_id: str
    actor: str
    new_id: Callable[[str], str]
    """prefix -> a fresh aggregate id."""
    facts: object = None
    """What the service observed for this command before deciding (``Service.prepare``), e.g. whether a
    repository can be read: decisions stay pure, the looking happens first."""


Route = Literal["mine", "elsewhere", "unknown"]
"""Which instance of a service settles a command, when several serve disjoint scopes (witnesses of different
rigs): ``mine``; ``elsewhere`` (a known thing another scope serves: leave it to that one); ``unknown`` (it names
nothing this instance knows: catch up with the log and ask again, and if it is still unknown, settle it, which
rejects it; any scope may, the log keeps one outcome)."""
