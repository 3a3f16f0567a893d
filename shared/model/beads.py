"""A bead as the mayor keeps it and shows it: one class is both the record of its projection and the answer of
its bead and mail queries (``gt.q.mayor.get``, ``list``, ``ready``, ``children``, ``inbox``, ``thread``), so the
answer is the record as it is, and a client reads it back into the same fields. Pure data."""

from __future__ import annotations

from datetime import datetime

import msgspec

from shared.model.events.beads import BeadStatus


class Bead(msgspec.Struct, kw_only=True, gc=False):
    """One work item (or message)."""

    id: str
    title: str
    type: str = "task"
    status: BeadStatus = "open"
    priority: int = 2
    description: str = ""
    labels: list[str] = []
    metadata: dict[str, str] = {}
    assignee: str | None = None
    parent: str | None = None
    needs: list[str] = []
    """Blocking dependencies: the bead is not ready while one of these is not closed."""
    created_at: datetime
    updated_at: datetime
    closed_at: datetime | None = None
    close_reason: str | None = None
    created_by: str = ""
    rig: str | None = None
    """The rig it is hooked to (set by sling)."""
    hook_session: str | None = None
    agent: str | None = None
    """The agent runtime its sessions run, chosen by a sling (``gt sling --agent``); None: the rig's."""
    slings: int = 0
    """How many times it was slung (re-slings included)."""
    convoys: list[str] = []
    """Convoys that track it."""
    version: int = 0
    """Stream sequence of this bead's last event: the expected sequence for its next append."""
    collected_molecule: str | None = None
    """The formula of its molecule, once garbage collection dropped the molecule (closed long enough; the log
    keeps its steps)."""


class Hold(msgspec.Struct, kw_only=True, gc=False):
    """A sling waiting for the bead's blockers to close (``bead.held``); the mayor carries it out then."""

    rig: str
    blockers: list[str] = []
    """The blockers that were open when it was held."""
    since: datetime
    agent: str | None = None
    """The agent runtime the held sling chose, slung with it."""


class HoldView(Hold, kw_only=True, gc=False):
    """A hold as ``get`` shows it: with the blockers still open now."""

    waiting_for: list[str] = []


class BeadDetail(Bead, kw_only=True, gc=False):
    """One bead as ``get`` answers it: the record, and its hold while it is held (the field is left out of the
    answer otherwise, so an unheld bead's answer is its record)."""

    hold: HoldView | msgspec.UnsetType = msgspec.UNSET
