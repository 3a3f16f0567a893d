"""Token usage of a polecat session (``gt.evt.usage.<session id>``): its own aggregate, so recording usage never
races the witness's lifecycle writes on the session's subject."""

from __future__ import annotations

from typing import ClassVar

from shared.model.events.base import Event
from shared.model.usage import ModelUsage


class SessionUsage(Event, frozen=True, kw_only=True):
    """The session's usage so far: running totals per model, not a delta. A later event replaces an earlier one,
    so a retried publish, a witness that re-reads a transcript from the start after a restart, or a replay from
    any point all fold to the same totals (a delta would count twice whatever was recorded but not yet known to
    the reader)."""

    TYPE: ClassVar[str] = "session.usage"
    AGGREGATE: ClassVar[str] = "usage"
    session_id: str
    rig: str
    bead: str
    models: tuple[ModelUsage, ...] = ()
    """Totals per model, ordered by model name."""
    final: bool = False
    """The session had ended when this was read: nothing more will be recorded for it."""
    context_tokens: int = 0
    """How full its conversation was at its newest answer: the tokens that answer's request carried."""
    context_window: int = 0
    """The model's context window in tokens, as its runtime reports it or knows it (0: unknown)."""

    def aggregate_id(self) -> str:
        return self.session_id


USAGE_EVENTS: tuple[type[Event], ...] = (SessionUsage,)
