"""Events of the molecule aggregate (``gt.evt.mol.<bead id>``): a bead's steps, checkpointed one by one."""

from __future__ import annotations

from typing import ClassVar

import msgspec

from shared.events.base import Event


class StepSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One step as cooked from a formula: everything an agent needs to work it."""

    id: str
    title: str
    description: str = ""
    needs: list[str] = []
    """Steps that must be done before this one starts."""
    acceptance: str = ""
    """How to tell the step is done."""


class MoleculeEvent(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "mol"
    bead_id: str
    """The bead the molecule is attached to (one molecule per bead)."""

    def aggregate_id(self) -> str:
        return self.bead_id


class MoleculeAttached(MoleculeEvent, frozen=True, kw_only=True):
    """A formula was cooked onto the bead: its steps, all pending."""

    TYPE: ClassVar[str] = "molecule.attached"
    formula: str
    formula_version: int = 1
    source: str = ""
    """Where the formula came from (``builtin:<file>``, or a path), for the record."""
    vars: dict[str, str] = {}
    steps: list[StepSpec]


class StepStarted(MoleculeEvent, frozen=True, kw_only=True):
    """pending -> in_progress."""

    TYPE: ClassVar[str] = "step.started"
    step: str


class StepCompleted(MoleculeEvent, frozen=True, kw_only=True):
    """-> done, for good: a later agent skips it."""

    TYPE: ClassVar[str] = "step.done"
    step: str


class MoleculeCompleted(MoleculeEvent, frozen=True, kw_only=True):
    """Every step is done."""

    TYPE: ClassVar[str] = "molecule.completed"


MOLECULE_EVENTS: tuple[type[Event], ...] = (MoleculeAttached, StepStarted, StepCompleted, MoleculeCompleted)
