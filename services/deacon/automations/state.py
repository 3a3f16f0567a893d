"""What the log says about automations: each one's runs (open, completed, failed), its last fire, its event
cursor, and the outcomes of the commands its formula runs sent. Plain data; ``projection`` folds it."""

from __future__ import annotations

from datetime import datetime

import msgspec

from shared.core.ids import stable_digest_id
from shared.model.events.automations import RunStatus

HISTORY = 10
"""Finished runs kept per automation (the log has them all)."""
FORMULA_STEPS = ("create", "sling", "close")
"""Commands a formula run may send: create its bead, sling it, and close it again when the sling is refused."""


class Run(msgspec.Struct, kw_only=True):
    id: str
    gate: str
    reason: str
    action: str
    fired_at: datetime
    fired_seq: int
    holder: str = ""
    lease_until: datetime | None = None
    cursor: int | None = None
    exec: str = ""
    timeout_s: float | None = None
    formula: str | None = None
    rig: str | None = None
    title: str = ""
    vars: dict[str, str] = {}
    status: RunStatus = "open"
    ended_at: datetime | None = None
    result: str = ""
    error: str = ""
    exit_code: int | None = None
    bead: str | None = None
    """formula: the bead its create command made."""
    create: str = ""
    sling: str = ""
    """formula: "" (no outcome yet), accepted or rejected, for its create and sling commands."""
    refusal: str = ""
    """formula: why the create or the sling was rejected."""
    bead_closed: bool = False
    close_reason: str = ""


class AutomationRecord(msgspec.Struct, kw_only=True):
    name: str
    version: int = 0
    """The aggregate's last subject sequence: the expected sequence of the next event on it."""
    runs: int = 0
    completed: int = 0
    failed: int = 0
    last_fired_at: datetime | None = None
    cursor: int = 0
    """Event gates: the newest event any run covered (0: none yet)."""
    open: Run | None = None
    history: list[Run] = []
    """The last finished runs, oldest first."""

    def last_run(self) -> Run | None:
        return self.open or (self.history[-1] if self.history else None)


class Awaited(msgspec.Struct, frozen=True, kw_only=True):
    automation: str
    run: str
    step: str


class AutomationState(msgspec.Struct, kw_only=True):
    automations: dict[str, AutomationRecord] = {}
    awaited: dict[str, Awaited] = {}
    """Command id -> the open formula run that sent (or will send) it."""
    beads: dict[str, str] = {}
    """Bead id -> the automation whose open formula run slung it."""
    newest: dict[str, int] = {}
    """Event type -> the sequence of the newest event of that type."""
    rig_prefixes: dict[str, str] = {}


def command_id(automation: str, run_id: str, step: str) -> str:
    """The fixed id of a formula run's command: re-sent after a crash, it is carried out once."""
    return stable_digest_id(f"automation/{automation}/{run_id}/{step}", prefix="auto")
