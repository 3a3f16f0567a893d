"""What a decide function returns: the events a command produces and the result the operator sees."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from shared.events import Event


class NewEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event to append; ``expected_seq`` is the aggregate's version the decision was based on (0 = new)."""

    payload: Event
    expected_seq: int | None


class Accepted(msgspec.Struct, frozen=True, kw_only=True):
    events: list[NewEvent] = []
    result: dict[str, Any] = {}


class DecideContext(msgspec.Struct, frozen=True, kw_only=True):
    """Time and id sources handed to pure decide functions (they read no clock and draw no randomness)."""

    now: datetime
    command_id: str
    actor: str
    new_id: Any  # Callable[[str], str]: prefix -> fresh aggregate id
