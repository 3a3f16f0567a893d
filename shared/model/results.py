"""What an accepted command answers: one Struct per kind of command (``Command[R]``'s ``R``), read by the sender.

The outcome's ``result`` (``cmd.accepted``) is one of these, encoded. Every key a result carried as a dict before
these types keeps its name and value on the wire: a key that only some answers carry (a sling's ``parked``, a
mail's ``ids``) is ``UNSET`` where it is not given, so it is left out as it was. The fields every answer carries
have defaults where an older outcome might lack them, so one stored by an earlier version still decodes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET, UnsetType

if TYPE_CHECKING:
    from typing_extensions import TypeVar

    R = TypeVar("R", covariant=True, default=Any)
    """A command's result type; a bare ``Command`` is ``Command[Any]``."""
else:  # the default is for the type checker only (PEP 696 is not in this Python's ``typing``)
    from typing import TypeVar

    R = TypeVar("R", covariant=True)

__all__ = [
    "UNSET",
    "AutomationRunResult",
    "BeadResult",
    "ConvoyResult",
    "CrewResult",
    "EscalationResult",
    "GateResult",
    "GcResult",
    "LeaseResult",
    "MailReadResult",
    "MailResult",
    "MergeQueueResult",
    "MrResult",
    "NudgeResult",
    "R",
    "RecordResult",
    "Result",
    "RigResult",
    "SessionResult",
    "SlingResult",
    "StaleHookResult",
    "StepResult",
    "UnsetType",
]


class Result(msgspec.Struct, kw_only=True):
    """Base of every command's result."""


class RecordResult(Result, kw_only=True):
    """The answer about one record (a bead, a rig, a merge request...): its id, its status now, and whether the
    command changed it (False: it was so already, and the command was a no-op)."""

    id: str
    status: str = ""
    changed: bool = True


class BeadResult(RecordResult, kw_only=True):
    """A bead created, updated, claimed or closed; a mail archived."""

    assignee: str | UnsetType = UNSET
    """Of a claim."""


class SlingResult(RecordResult, kw_only=True):
    """A bead slung, held, or unslung."""

    rig: str = ""
    convoy: str | UnsetType | None = UNSET
    """The auto-convoy the sling created (None: none)."""
    formula: str | UnsetType | None = UNSET
    """The formula cooked onto it (None: no molecule attached now)."""
    waiting_for: list[str] | UnsetType = UNSET
    """Held: the open blockers it waits for."""
    ignored_blockers: list[str] | UnsetType = UNSET
    """Forced: the open blockers it went past."""
    parked: bool | UnsetType = UNSET
    """The rig is parked: the work waits."""
    was: str | UnsetType = UNSET
    """Unslung: what the bead was (hooked, in_progress, held)."""
    agent: str | UnsetType = UNSET
    """The agent runtime the bead's sessions run, chosen by this sling or an earlier one (left out: the rig's)."""


class StepResult(Result, kw_only=True):
    """A molecule step started or done."""

    bead: str
    step: str
    status: str = ""
    changed: bool = True
    done: int = 0
    total: int = 0
    complete: bool | UnsetType = UNSET
    """Of a step done: whether every step of the molecule is done now."""


class GateResult(Result, kw_only=True):
    """A step's gate opened (``changed``: by this command; False: it was open already)."""

    bead: str
    step: str
    by: str = ""
    """What opened it: ``timer``, ``ci`` or ``operator``."""
    changed: bool = True


class ConvoyResult(RecordResult, kw_only=True):
    closed: int = 0
    """Its beads closed."""
    total: int = 0


class EscalationResult(RecordResult, kw_only=True):
    severity: str | UnsetType = UNSET


class MailResult(Result, kw_only=True):
    """A message sent or replied to."""

    id: str
    to: str = ""
    thread: str | None = None
    changed: bool = True
    ids: list[str] | UnsetType = UNSET
    """A message to several inboxes (a rig): each copy's id."""
    recipients: list[str] | UnsetType = UNSET


class MailReadResult(Result, kw_only=True):
    id: str
    read: bool = True
    changed: bool = True
    left_unread_for: str | UnsetType | None = UNSET
    """Read by someone else than its addressee: whom it stays unread for."""


class MrResult(RecordResult, kw_only=True):
    """A merge request submitted, retried or rejected. Submitted again unchanged, it answers the whole record as
    the refinery holds it (``services/refinery/state.py`` ``MergeRequest``, times as ISO text)."""

    bead: str | UnsetType = UNSET
    rig: str | UnsetType = UNSET
    head: str | UnsetType = UNSET
    branch: str | UnsetType = UNSET
    target: str | UnsetType = UNSET
    priority: int | UnsetType = UNSET
    session: str | UnsetType | None = UNSET
    bundle: str | UnsetType | None = UNSET
    submitted_at: str | UnsetType = UNSET
    queued_at: str | UnsetType = UNSET
    attempts: int | UnsetType = UNSET
    failures: int | UnsetType = UNSET
    holder: str | UnsetType | None = UNSET
    lease_until: str | UnsetType | None = UNSET
    conflict_command: str | UnsetType | None = UNSET
    blocked_by: str | UnsetType | None = UNSET
    gate: str | UnsetType | None = UNSET
    exit_code: int | UnsetType | None = UNSET
    tail: str | UnsetType = UNSET
    merged_commit: str | UnsetType | None = UNSET
    already: bool | UnsetType = UNSET
    batch: list[str] | UnsetType = UNSET
    bug_bead_command: str | UnsetType | None = UNSET
    reason: str | UnsetType = UNSET
    retries: int | UnsetType = UNSET
    not_before: str | UnsetType | None = UNSET
    ended_at: str | UnsetType | None = UNSET
    version: int | UnsetType = UNSET
    incarnation: int | UnsetType = UNSET


class MergeQueueResult(Result, kw_only=True):
    """A rig's merge queue resumed."""

    rig: str
    paused: bool = False
    changed: bool = True
    was: str | UnsetType = UNSET
    """Why it had paused."""


class RigResult(RecordResult, kw_only=True):
    """A rig added, updated, parked, unparked or removed; an update names the settings it changed, with their new
    values."""

    rig: str | UnsetType = UNSET
    repo: str | UnsetType = UNSET
    base_branch: str | UnsetType = UNSET
    prefix: str | UnsetType = UNSET
    incarnation: int | UnsetType = UNSET
    """Added again after its removal: the new rig's incarnation."""
    fields: list[str] | UnsetType = UNSET
    waiting: int | UnsetType = UNSET
    """Beads hooked on it that wait for a polecat."""
    hooked: list[str] | UnsetType = UNSET
    setup_command: str | UnsetType = UNSET
    lint_command: str | UnsetType = UNSET
    test_command: str | UnsetType = UNSET
    agent_command: str | UnsetType = UNSET
    max_polecats: int | UnsetType = UNSET
    max_respawns: int | UnsetType = UNSET
    stall_after_s: float | UnsetType = UNSET
    git_name: str | UnsetType = UNSET
    git_email: str | UnsetType = UNSET
    gate_env: list[str] | UnsetType = UNSET
    gate_pristine: bool | UnsetType = UNSET


class SessionResult(RecordResult, kw_only=True):
    """A polecat session's done intent, finish, handoff or stop."""

    bead: str | None = None
    polecat: str | None = None


class StaleHookResult(Result, kw_only=True):
    """A stale hook the deacon reported, as the witness resolved it."""

    id: str
    """The bead."""
    status: str = ""
    """not_stale, or the resolution (resling, escalate, ...)."""
    changed: bool = True
    why: str | UnsetType = UNSET
    session: str | UnsetType = UNSET
    detail: str | UnsetType = UNSET


class TownAgentResult(RecordResult, kw_only=True):
    """A town agent started, stopped or asked (``id``: its name; ``status``: running or stopped)."""

    agent: str | UnsetType = UNSET
    """The runtime it runs."""
    ask_id: str | UnsetType = UNSET
    """The request queued (``agent.ask``): its answer is ``town_agent.answered`` with this id."""


class CrewResult(RecordResult, kw_only=True):
    """A crew member added, given a bead or removed (``id``: ``<rig>-<name>``; ``status``: added or removed)."""

    rig: str | UnsetType = UNSET
    name: str | UnsetType = UNSET
    branch: str | UnsetType = UNSET
    workspace: str | UnsetType = UNSET
    hooked: str | UnsetType | None = UNSET


class NudgeResult(RecordResult, kw_only=True):
    rig: str | UnsetType = UNSET
    polecat: str | UnsetType = UNSET
    session: str | UnsetType | None = UNSET
    expires_at: str | UnsetType = UNSET
    live: bool | UnsetType = UNSET
    """Its target runs now: typed in at once."""
    delivered_to: str | UnsetType | None = UNSET
    """Added by `gt nudge` once it saw the nudge delivered (then ``status`` is ``delivered``)."""


class LeaseResult(Result, kw_only=True):
    """A lease acquired or released; asked again of what is already so, the lease's whole record."""

    lease: str | UnsetType = UNSET
    name: str | UnsetType = UNSET
    holder: str | UnsetType = UNSET
    token: int | UnsetType = UNSET
    ttl_s: float | UnsetType = UNSET
    status: str | UnsetType = UNSET
    acquired_at: str | UnsetType = UNSET
    ended_at: str | UnsetType | None = UNSET
    version: int | UnsetType = UNSET
    changed: bool = True


class GcResult(Result, kw_only=True):
    id: str
    cutoff: str = ""
    ttl_s: float = 0.0
    changed: bool = True


class AutomationRunResult(Result, kw_only=True):
    id: str
    run: str = ""
    status: str = ""
    action: str = ""
