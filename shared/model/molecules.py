"""A bead's molecule as the mayor keeps it and shows it: the record of its projection, and (``MoleculeView``) the
answer of ``gt.q.mayor.molecule``, the record with where it stands. Pure data."""

from __future__ import annotations

from datetime import datetime

import msgspec

from shared.model.events.beads import BeadStatus
from shared.model.events.molecules import GateOpener, StepGate, StepStatus


class Step(msgspec.Struct, kw_only=True, gc=False):
    id: str
    title: str
    description: str = ""
    needs: list[str] = []
    acceptance: str = ""
    status: StepStatus = "pending"
    started_at: datetime | None = None
    done_at: datetime | None = None
    done_by: str | None = None
    wait: StepGate | None = None
    """Its gate (the formula's ``wait``, ``shared.model.gates``); None: it waits for nothing but its needs."""
    waiting_since: datetime | None = None
    """When its closed gate began waiting (the step became current): a timer runs from then."""
    gate_opened_at: datetime | None = None
    gate_opened_by: GateOpener | None = None
    gate_opener: str = ""
    """Who opened it (the event's actor: ``mayor``, ``deacon``, ``operator:<name>``)."""
    gate_detail: str = ""
    """The operator's note, or the tail of the CI check's output."""

    def gate_closed(self) -> bool:
        """It has a gate that has not opened: it can be neither started nor done."""
        return self.wait is not None and self.gate_opened_at is None


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


class MoleculeView(Molecule, kw_only=True, gc=False):
    """A molecule as ``molecule`` answers it: the record, where it stands, and its bead's status and rig."""

    current_step: str | None = None
    """The step to work on now (None: none is, or every one is done)."""
    done: int = 0
    total: int = 0
    complete: bool = False
    bead_status: BeadStatus = "open"
    rig: str | None = None
