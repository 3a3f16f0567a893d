"""What the mayor knows: beads, molecules, convoys and escalations. Plain data, folded from the log."""

from __future__ import annotations

from datetime import datetime

import msgspec

from services.mayor.costs import UsageBook

STATUSES = ("open", "hooked", "in_progress", "closed")
STATUS_RANK = {status: rank for rank, status in enumerate(STATUSES)}
STEP_STATUSES = ("pending", "in_progress", "done")
STEP_RANK = {status: rank for rank, status in enumerate(STEP_STATUSES)}
INFRA_TYPES = frozenset(
    {"molecule", "wisp", "message", "gate", "merge-request", "session", "agent", "role", "rig", "convoy", "escalation"}
)
"""Types that are plumbing, not work: never offered by ``ready`` and never slung."""
WISP_TYPE = "wisp"
"""Ephemeral beads: once closed long enough, garbage collection drops them entirely."""
MESSAGE_TYPE = "message"
READ_LABEL = "read"


class Bead(msgspec.Struct, kw_only=True, gc=False):
    """One work item (or message)."""

    id: str
    title: str
    type: str = "task"
    status: str = "open"
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


class Step(msgspec.Struct, kw_only=True, gc=False):
    id: str
    title: str
    description: str = ""
    needs: list[str] = []
    acceptance: str = ""
    status: str = "pending"
    started_at: datetime | None = None
    done_at: datetime | None = None
    done_by: str | None = None


class Molecule(msgspec.Struct, kw_only=True, gc=False):
    """A bead's steps, cooked from a formula."""

    bead_id: str
    formula: str
    formula_version: int = 1
    source: str = ""
    vars: dict[str, str] = {}
    steps: list[Step] = []
    attached_at: datetime
    completed_at: datetime | None = None
    version: int = 0


class Convoy(msgspec.Struct, kw_only=True, gc=False):
    id: str
    title: str
    beads: list[str] = []
    owned: bool = False
    auto: bool = False
    status: str = "open"
    created_at: datetime
    created_by: str = ""
    closed_at: datetime | None = None
    landed: bool = False
    forced: bool = False
    version: int = 0


class Escalation(msgspec.Struct, kw_only=True, gc=False):
    id: str
    severity: str
    original_severity: str
    source: str
    message: str
    bead: str | None = None
    status: str = "open"
    """open -> acked -> closed (or open -> closed)."""
    raised_at: datetime
    last_raised_at: datetime
    """When it was raised, or last re-escalated: re-escalation counts from here."""
    reescalations: int = 0
    acked_at: datetime | None = None
    acked_by: str | None = None
    closed_at: datetime | None = None
    closed_by: str | None = None
    close_reason: str | None = None
    version: int = 0


class KnownRig(msgspec.Struct, kw_only=True, gc=False):
    """A rig as the mayor needs it (the witness's ``rig.*`` and session events): whether it exists and takes work
    (sling), and which polecats it has had and the session each holds now (mail addresses)."""

    name: str
    parked: bool = False
    """Slings to it are accepted and wait: the witness starts no session there."""
    removed: bool = False
    """Slings to it are refused."""
    polecats: dict[str, str | None] = {}
    """Polecat name -> the session it holds now (None: none now)."""


class MayorState(msgspec.Struct, kw_only=True):
    beads: dict[str, Bead] = {}
    """Every bead, in creation order."""
    children: dict[str, list[str]] = {}
    """Parent id -> child ids, in creation order."""
    molecules: dict[str, Molecule] = {}
    """Bead id -> its molecule."""
    convoys: dict[str, Convoy] = {}
    open_convoys: list[str] = []
    """Ids of the convoys still open, so reconcile looks at those only."""
    escalations: dict[str, Escalation] = {}
    holds: dict[str, Hold] = {}
    """Bead id -> its held sling, for open beads only (a sling or a close ends it), so reconcile looks at those."""
    rigs: dict[str, KnownRig] = {}
    """Every rig added, by name (removed ones too: their names stay taken), with its polecats: what a sling may
    name, and what ``polecat:<rig>/<name>`` and ``rig:<rig>`` may address."""
    usage: UsageBook = msgspec.field(default_factory=UsageBook)
    """Token usage of polecat sessions (``session.usage``), for ``gt costs``."""
    commands_accepted: int = 0
    commands_rejected: int = 0
