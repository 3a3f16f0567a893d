"""Events of the rig aggregate (``gt.evt.rig.<name>``), written by the witness."""

from __future__ import annotations

from typing import ClassVar

from shared.events.base import Event


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


class RigMassDeath(RigEvent, frozen=True, kw_only=True):
    """Several sessions of the rig died within a short window; an escalation was raised."""

    TYPE: ClassVar[str] = "rig.mass_death"
    sessions: list[str]
    window_s: float


RIG_EVENTS: tuple[type[Event], ...] = (RigAdded, RigMassDeath)
