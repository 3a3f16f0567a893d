"""Events of the molecule aggregate (``gt.evt.mol.<bead id>``): a bead's steps, checkpointed one by one."""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from shared.model.events.base import Event

StepStatus = Literal["pending", "in_progress", "done"]
STEP_STATUSES: tuple[StepStatus, ...] = ("pending", "in_progress", "done")


class TimerGate(msgspec.Struct, frozen=True, kw_only=True, tag="timer"):
    """Opens ``seconds`` after the step is ready (its needs all done): by the mayor, on its patrol."""

    seconds: float


class CiGate(msgspec.Struct, frozen=True, kw_only=True, tag="ci"):
    """Opens when ``command`` (``sh -c``, run by the deacon as an operator's automation is) exits 0, polled while
    the step is ready."""

    command: str
    vars: dict[str, str] = {}
    """The molecule's vars, given to the command as its environment (``GT_VAR_<name>``), never written into it: a
    value (a bead's title) is never shell text."""


class HumanGate(msgspec.Struct, frozen=True, kw_only=True, tag="human"):
    """Opens when an operator approves it (``gt gate approve BEAD STEP``), answering ``question``."""

    question: str


StepGate = TimerGate | CiGate | HumanGate
GateOpener = Literal["timer", "ci", "operator"]


class StepSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One step as cooked from a formula: everything an agent needs to work it."""

    id: str
    title: str
    description: str = ""
    needs: list[str] = []
    """Steps that must be done before this one starts."""
    acceptance: str = ""
    """How to tell the step is done."""
    wait: StepGate | None = None
    """What the step waits for before it can be started or done (a formula's ``wait``); None: nothing."""


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
    """Every step is done: stored once per molecule, when its last step is done the first time (a round of rework
    steps appended later does not store it again)."""

    TYPE: ClassVar[str] = "molecule.completed"


class ReworkAdded(MoleculeEvent, frozen=True, kw_only=True):
    """The merge queue sent the bead's work back (``mr.conflicted`` with ``sent_back``, or ``mr.failed`` not
    escalated): the mayor appends a round of rework steps after the molecule's last step, all pending. Done steps
    stay done: rework never reopens one. One per send-back (``sent_back_by``, the send-back event's id)."""

    TYPE: ClassVar[str] = "molecule.rework_added"
    mr_id: str
    """The merge request that was sent back."""
    sent_back_by: str
    """The id of the ``mr.conflicted`` or ``mr.failed`` event that sent it back."""
    round: int
    """1 for the molecule's first rework, 2 for the next, ...: the ``<round>`` of the steps' ids."""
    reason: str
    """``conflict``, or the gate that failed (setup, lint, test, ...)."""
    steps: list[StepSpec]


class GateOpened(MoleculeEvent, frozen=True, kw_only=True):
    """The gate of ``step`` opened (its ``wait``): the step may be worked from now on. Once per step: the molecule's
    expected sequence makes a second opening (two patrols, a restart, a resent command) a no-op."""

    TYPE: ClassVar[str] = "step.gate_opened"
    step: str
    by: GateOpener
    """What opened it: its timer ran out, its CI command exited 0, or an operator approved it."""
    detail: str = ""
    """The operator's note, or the tail of the CI command's output."""


MOLECULE_EVENTS: tuple[type[Event], ...] = (
    MoleculeAttached,
    StepStarted,
    StepCompleted,
    MoleculeCompleted,
    ReworkAdded,
    GateOpened,
)
