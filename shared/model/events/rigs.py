"""Events of the rig aggregate (``gt.evt.rig.<name>``), written by the witness."""

from __future__ import annotations

from typing import ClassVar

import msgspec

from shared.model.events.base import Event


class RigEvent(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "rig"
    rig: str

    def aggregate_id(self) -> str:
        return self.rig


class RigAdded(RigEvent, frozen=True, kw_only=True):
    """A project the town works on: its repository and how agents and gates run there."""

    TYPE: ClassVar[str] = "rig.added"
    repo: str
    base_branch: str = "main"
    prefix: str
    """Prefix of the rig's bead ids."""
    setup_command: str = ""
    lint_command: str = ""
    test_command: str = ""
    agent_command: str
    max_polecats: int = 4
    max_respawns: int = 3
    """A bead whose sessions died more often than this is escalated instead of respawned."""
    stall_after_s: float = 600.0
    git_name: str = ""
    """Template of the git name the rig's polecats commit with (empty: ``{rig}/{polecat}``)."""
    git_email: str = ""
    """Template of their git email (empty: ``{polecat}.{rig}@gastown.invalid``)."""
    gate_env: list[str] = []
    """Names of the refinery's environment variables its gates see besides the allowlist."""
    gate_pristine: bool = False
    """Each merge's gates run in a workspace made fresh for them; False (an event from before it too): the rig's
    gate workspace, its ignored files and the gate's home persist between merges."""


class RigMassDeath(RigEvent, frozen=True, kw_only=True):
    """Several sessions of the rig died within a short window; an escalation was raised."""

    TYPE: ClassVar[str] = "rig.mass_death"
    sessions: list[str]
    window_s: float


class RigUpdated(RigEvent, frozen=True, kw_only=True):
    """Some of the rig's settings changed; only the fields present did. A session already running keeps what it
    started with (its agent command, set-up); the next sessions and the next merges take the new values."""

    TYPE: ClassVar[str] = "rig.updated"
    setup_command: str | msgspec.UnsetType = msgspec.UNSET
    lint_command: str | msgspec.UnsetType = msgspec.UNSET
    test_command: str | msgspec.UnsetType = msgspec.UNSET
    agent_command: str | msgspec.UnsetType = msgspec.UNSET
    max_polecats: int | msgspec.UnsetType = msgspec.UNSET
    max_respawns: int | msgspec.UnsetType = msgspec.UNSET
    stall_after_s: float | msgspec.UnsetType = msgspec.UNSET
    git_name: str | msgspec.UnsetType = msgspec.UNSET
    git_email: str | msgspec.UnsetType = msgspec.UNSET
    gate_env: list[str] | msgspec.UnsetType = msgspec.UNSET
    gate_pristine: bool | msgspec.UnsetType = msgspec.UNSET


class RigParked(RigEvent, frozen=True, kw_only=True):
    """The rig starts no new sessions; running ones finish, slings to it wait, its merge queue goes on."""

    TYPE: ClassVar[str] = "rig.parked"
    reason: str = ""


class RigUnparked(RigEvent, frozen=True, kw_only=True):
    """The rig starts sessions again: the beads that waited get theirs."""

    TYPE: ClassVar[str] = "rig.unparked"


class RigRemoved(RigEvent, frozen=True, kw_only=True):
    """The rig is gone for new work: parked for good, no longer listed, slings to it refused. Sessions still
    running finish; ``hooked`` names the beads that were hooked to it (a forced remove)."""

    TYPE: ClassVar[str] = "rig.removed"
    hooked: list[str] = []


RIG_EVENTS: tuple[type[Event], ...] = (RigAdded, RigMassDeath, RigUpdated, RigParked, RigUnparked, RigRemoved)
