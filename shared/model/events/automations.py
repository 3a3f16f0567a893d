"""Events of the automation aggregate (``gt.evt.automation.<name>``), written by the deacon.

A run is ``automation.fired`` followed, once, by ``automation.completed`` or ``automation.failed``. ``fired`` is
stored (with the aggregate's expected sequence) before the action starts, and carries what the action is, so a
restarted deacon finishes or settles the run from the log alone, even if the file changed or went away.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from shared.model.events.base import Event

RunStatus = Literal["open", "completed", "failed"]
"""An automation's run: open (fired), completed or failed."""


class AutomationEvent(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "automation"
    automation: str
    """The automation's name (its file's stem)."""

    def aggregate_id(self) -> str:
        return self.automation


class AutomationFired(AutomationEvent, frozen=True, kw_only=True):
    """A run starts; until its completed or failed event the automation does not fire again."""

    TYPE: ClassVar[str] = "automation.fired"
    run_id: str
    gate: str
    """cooldown, cron, event, condition, or manual (``gt automation run``, whatever the file's gate)."""
    reason: str
    """Why the gate opened, for a person: "never run", "schedule 0 3 * * * matched 2026-05-01 03:00 UTC", ..."""
    action: str
    """exec or formula."""
    cursor: int | None = None
    """Event gate: the stream sequence of the newest event this run covers; later runs need a newer one."""
    holder: str = ""
    """The deacon process that runs it."""
    lease_until: datetime | None = None
    """exec: past this time (the timeout plus a grace) a run still open is settled as failed by any deacon."""
    exec: str = ""
    """exec: the shell command line, as the file had it when the run fired."""
    timeout_s: float | None = None
    """exec: seconds the command may run."""
    formula: str | None = None
    rig: str | None = None
    title: str = ""
    vars: dict[str, str] = {}
    """formula: what is slung where, as the file had it when the run fired."""


class AutomationCompleted(AutomationEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "automation.completed"
    run_id: str
    result: str = ""
    """A summary: the tail of the command's output, or the slung bead and how it was closed."""
    bead: str | None = None
    """formula: the bead the run created and slung."""


class AutomationFailed(AutomationEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "automation.failed"
    run_id: str
    error: str
    exit_code: int | None = None
    """exec: the command's exit code (124: timed out); None when it did not run to an exit code."""
    bead: str | None = None


AUTOMATION_EVENTS: tuple[type[Event], ...] = (AutomationFired, AutomationCompleted, AutomationFailed)
