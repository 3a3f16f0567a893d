"""Molecule gates: a formula step's ``wait`` (``timer``, ``ci``, ``human``), as every service that acts on one sees it.

A gated step waits from the moment it becomes its molecule's current step (the first step not done whose needs are
all done): its timer runs from then, its CI command is polled from then, an operator may approve it from then (or
earlier). Until its gate opens (``step.gate_opened``, once) the step can be neither started nor done, the witness
starts no session for the bead (the bead stays hooked, no stall), and a session still running on it is ended once it
has gone quiet; a fresh session is started when the gate opens.

``MoleculeGates`` is the fold the witness and the deacon keep of a molecule: its order, its needs, what is done and
which gates are still closed. The mayor keeps the whole molecule (``shared.model.molecules``). Pure.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec

from shared.core.durations import duration_text
from shared.model.events.beads import BeadClosed
from shared.model.events.molecules import (
    CiGate,
    GateOpened,
    HumanGate,
    MoleculeAttached,
    ReworkAdded,
    StepCompleted,
    StepGate,
    StepSpec,
    TimerGate,
)
from shared.model.molecules import Step

CI_OUTPUT_SHOWN = 1000
"""Characters of a CI command's output a gate's opening keeps."""


def describe(gate: StepGate) -> str:
    """The gate in words, for a person or an agent: what it waits for."""
    match gate:
        case TimerGate(seconds=seconds):
            return f"a timer of {duration_text(seconds)}"
        case CiGate(command=command):
            return f"a CI check (`{command}` exits 0)"
        case HumanGate(question=question):
            return f"an operator's approval ({question})"


def opens_at(gate: StepGate, waiting_since: datetime | None) -> datetime | None:
    """When a timer gate opens (None: another kind, or its step is not waiting yet)."""
    if not isinstance(gate, TimerGate) or waiting_since is None:
        return None
    return waiting_since + timedelta(seconds=gate.seconds)


def how_to_open(bead: str, step: str, gate: StepGate) -> str:
    """What opens it, for `gt prime` and `gt gate list`."""
    match gate:
        case TimerGate():
            return "it opens by itself when the timer runs out"
        case CiGate():
            return "the deacon runs the check again and again (GT_GATE_POLL); it opens when the check exits 0"
        case HumanGate():
            return f"an operator opens it with `gt gate approve {bead} {step}`"


class MoleculeGates(msgspec.Struct, kw_only=True, gc=False):
    """A molecule's steps in order with their needs, the ones done, and the gates not opened yet."""

    steps: list[str] = []
    needs: dict[str, list[str]] = {}
    done: list[str] = []
    closed: dict[str, StepGate] = {}
    """Gated steps whose gate has not opened, by step id."""
    waiting_since: dict[str, datetime] = {}
    """When each closed gate's step became current (its timer runs from then)."""

    def current(self) -> str | None:
        """The first step not done whose needs are all done."""
        done = set(self.done)
        for step in self.steps:
            if step not in done and all(need in done for need in self.needs.get(step, ())):
                return step
        return None

    def waiting(self) -> tuple[str, StepGate] | None:
        """The current step and its gate when that gate is closed: the molecule waits on it."""
        step = self.current()
        if step is None or step not in self.closed:
            return None
        return step, self.closed[step]

    def add_steps(self, specs: list[StepSpec], at: datetime) -> None:
        """Steps appended (a molecule attached, or a rework round): a step id seen before is never added again."""
        for spec in specs:
            if spec.id in self.needs:
                continue
            self.steps.append(spec.id)
            self.needs[spec.id] = list(spec.needs)
            if spec.wait is not None:
                self.closed[spec.id] = spec.wait
        self.arm(at)

    def step_done(self, step: str, at: datetime) -> None:
        if step in self.needs and step not in self.done:
            self.done.append(step)
            self.closed.pop(step, None)  # done (an operator's step done overrides nothing: it was refused before)
            self.waiting_since.pop(step, None)
        self.arm(at)

    def gate_opened(self, step: str) -> None:
        self.closed.pop(step, None)
        self.waiting_since.pop(step, None)

    def arm(self, at: datetime) -> None:
        """The current step's closed gate starts waiting at ``at`` (the event that made it current)."""
        waiting = self.waiting()
        if waiting is not None and waiting[0] not in self.waiting_since:
            self.waiting_since[waiting[0]] = at


class GateView(msgspec.Struct, kw_only=True, gc=False):
    """A closed gate as ``gt.q.mayor.gates`` answers it (``gt gate list``)."""

    bead: str
    bead_title: str = ""
    rig: str | None = None
    step: str
    step_title: str = ""
    gate: StepGate
    waiting: bool = False
    """Its step is the molecule's current one: the bead waits on it now (False: earlier steps are not done yet)."""
    waiting_since: datetime | None = None
    opens_at: datetime | None = None
    """A timer's: when it opens."""


def step_gate_text(bead: str, step: Step) -> str | None:
    """What `gt prime` and `gt mol status` say of a step's gate: closed (what it waits for, what opens it, when a
    timer does), or opened (by what, with the operator's note or the check's output); None: it has none."""
    if step.wait is None:
        return None
    if step.gate_opened_at is not None:
        by = {"timer": "its timer ran out", "ci": "its CI check passed", "operator": "an operator approved it"}
        said = f": {step.gate_detail}" if step.gate_detail else ""
        return f"Its gate ({describe(step.wait)}) opened: {by.get(step.gate_opened_by or '', 'opened')}{said}"
    due = opens_at(step.wait, step.waiting_since)
    when = f" (at {due:%Y-%m-%d %H:%M:%S} UTC)" if due is not None else ""
    return f"It waits on its gate, {describe(step.wait)}{when}: {how_to_open(bead, step.id, step.wait)}."


GATE_KINDS: tuple[type[StepGate], ...] = (TimerGate, CiGate, HumanGate)


def fold_book(
    book: dict[str, MoleculeGates], payload: object, at: datetime, kinds: tuple[type, ...] = GATE_KINDS
) -> None:
    """Keep ``book`` (bead -> its molecule's gates) of the molecules with a closed gate of ``kinds``, of beads not
    closed: the fold the refinery (every kind: no work of a bead with a closed gate is merged) and the deacon (``ci``:
    the checks it runs) keep. ``at``: the event's time."""
    match payload:
        case MoleculeAttached(bead_id=bead, steps=steps):
            if bead not in book and any(isinstance(s.wait, kinds) for s in steps):
                book[bead] = molecule = MoleculeGates()
                molecule.add_steps(steps, at)
        case ReworkAdded(bead_id=bead, steps=steps) if bead in book:
            book[bead].add_steps(steps, at)
        case StepCompleted(bead_id=bead, step=step) if bead in book:
            book[bead].step_done(step, at)
            _forget_when_open(book, bead, kinds)
        case GateOpened(bead_id=bead, step=step) if bead in book:
            book[bead].gate_opened(step)
            _forget_when_open(book, bead, kinds)
        case BeadClosed(bead_id=bead):
            book.pop(bead, None)


def _forget_when_open(book: dict[str, MoleculeGates], bead: str, kinds: tuple[type, ...]) -> None:
    if not any(isinstance(gate, kinds) for gate in book[bead].closed.values()):
        del book[bead]  # no gate of those kinds left closed


def closed_gates_text(bead: str, molecule: MoleculeGates) -> str:
    """Why the work of ``bead`` may not be handed in yet: its gates not opened, and what opens them."""
    named = "; ".join(
        f"step {step} waits on {describe(gate)} ({how_to_open(bead, step, gate)})"
        for step, gate in molecule.closed.items()
    )
    return (
        f"bead {bead} has gates not opened: {named}. Its work is handed in (`gt done`) once they are open and their "
        "steps done"
    )
