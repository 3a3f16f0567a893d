"""Decisions on work: slinging beads to rigs (cooking their molecules) and checkpointing steps. Pure."""

from __future__ import annotations

from services.mayor.decide.beads import fresh_id, get_bead
from services.mayor.state import (
    KnownRig,
    MayorState,
    Molecule,
    Step,
    open_blockers,
    unmet_needs,
)
from shared.core.errors import CommandError
from shared.core.ids import CONVOY_PREFIX
from shared.model import gates
from shared.model.commands import BeadSling, BeadUnsling, GateApprove, GateOpen, StepDone, StepStart
from shared.model.commands.actors import POLECAT_PREFIX
from shared.model.decision import Accepted, DecideContext, NewEvent
from shared.model.events import (
    BeadHeld,
    BeadSlung,
    BeadUnslung,
    CiGate,
    ConvoyCreated,
    Event,
    GateOpened,
    GateOpener,
    MoleculeAttached,
    MoleculeCompleted,
    StepCompleted,
    StepStarted,
)
from shared.model.events.beads import INFRA_TYPES, WORKING
from shared.model.formulas import Formula, FormulaError, cook
from shared.model.results import UNSET, GateResult, SlingResult, StepResult, UnsetType

DEFAULT_FORMULA = "polecat-work"


def sling(state: MayorState, cmd: BeadSling, ctx: DecideContext) -> Accepted[SlingResult]:
    """``ctx.facts``: the formula the service looked up for this sling before deciding (``effects.sling_formula``),
    or the ``FormulaError`` saying why there is none usable; cooked only if the bead gets a molecule."""
    bead = get_bead(state, cmd.id)
    if bead.status == "closed":
        raise CommandError("backward_transition", f"bead {bead.id} is closed; sling a new bead that references it")
    if bead.type in INFRA_TYPES:
        raise CommandError("invalid", f"bead {bead.id} is a {bead.type}, not work: it cannot be slung")
    rehook = bead.status in WORKING
    if rehook and not cmd.force:
        raise CommandError(
            "conflict",
            f"bead {bead.id} is already {bead.status} on rig {bead.rig}; only a forced re-sling moves the hook "
            f"(`gt unsling {bead.id}` gives it back)",
        )
    rig = _rig_taking_work(state, cmd.rig)
    # A hooked bead's blockers were settled when it was first slung: a re-sling only moves the hook.
    blockers = [] if rehook else open_blockers(state, bead)
    if blockers and not (cmd.force or cmd.hold):
        raise CommandError("blocked", _blocked_message(state, bead.id, blockers))
    held = bool(blockers) and cmd.hold
    hold = state.holds.get(bead.id)
    # The bead's runtime: this sling's choice, else the one an earlier sling (or its hold) made, carried on.
    agent = cmd.agent or (hold.agent if hold is not None else None) or bead.agent
    if held and hold is not None and hold.rig == cmd.rig and agent == hold.agent:
        unchanged = SlingResult(
            id=bead.id, status="held", changed=False, rig=cmd.rig, waiting_for=blockers, agent=_agent(agent)
        )
        return Accepted(result=unchanged)
    events: list[NewEvent] = []
    convoy_id = None
    if not rehook and not cmd.no_convoy and not _auto_convoy_open(state, bead.convoys):
        convoy_id = fresh_id(ctx, CONVOY_PREFIX, state.convoys)
    hooked = _hook(bead.id, cmd, rehook, blockers, convoy_id, agent)
    events.append(NewEvent(payload=hooked, expected_seq=bead.version))
    molecule = state.molecules.get(bead.id)
    if molecule is None and not cmd.no_formula:
        events.append(_attach(bead.id, bead.title, cmd, ctx.facts))
    elif molecule is not None and cmd.formula and cmd.formula != molecule.formula:
        raise CommandError(
            "conflict", f"bead {bead.id} already carries a {molecule.formula} molecule; a re-sling keeps it"
        )
    if convoy_id is not None:
        convoy = ConvoyCreated(
            convoy_id=convoy_id, title=f"Work: {bead.title}", beads=[bead.id], owned=cmd.owned, auto=True
        )
        events.append(NewEvent(payload=convoy, expected_seq=0))
    status = "held" if held else bead.status if rehook else "hooked"
    out = SlingResult(
        id=bead.id,
        status=status,
        changed=True,
        rig=cmd.rig,
        convoy=convoy_id,
        formula=_formula_name(events),
        waiting_for=blockers if blockers and held else UNSET,
        ignored_blockers=blockers if blockers and not held else UNSET,
        parked=True if rig.parked else UNSET,
        agent=_agent(agent),
    )
    return Accepted(events=events, result=out)


def _agent(chosen: str | None) -> str | UnsetType:
    """The runtime a sling's result names: the bead's own choice (left out when the rig's agent runs it)."""
    return UNSET if chosen is None else chosen


def _hook(
    bead_id: str, cmd: BeadSling, rehook: bool, blockers: list[str], convoy_id: str | None, agent: str | None
) -> Event:
    """``bead.held`` when the sling waits for the blockers, else ``bead.slung`` (forced past them, if any); each
    with the bead's runtime, if it has one."""
    if blockers and cmd.hold:
        return BeadHeld(bead_id=bead_id, rig=cmd.rig, blockers=blockers, agent=agent)
    forced = cmd.force and (rehook or bool(blockers))
    return BeadSlung(
        bead_id=bead_id,
        rig=cmd.rig,
        session=cmd.session,
        forced=forced,
        convoy_id=convoy_id,
        ignored_blockers=blockers,
        agent=agent,
    )


def _blocked_message(state: MayorState, bead_id: str, blockers: list[str]) -> str:
    def told(blocker: str) -> str:
        found = state.beads.get(blocker)
        return f"{blocker} ({found.status if found is not None else 'does not exist'})"

    hold = state.holds.get(bead_id)
    held = f" (it is held for rig {hold.rig} already)" if hold is not None else ""
    return (
        f"bead {bead_id} is blocked by {', '.join(told(b) for b in blockers)}: it can be slung once they are "
        f"closed{held} (`gt ready` lists the beads that can go; `--hold` holds it until then); "
        "`--force` (`force`) slings it anyway, and the sling records the blockers it went past"
    )


def _auto_convoy_open(state: MayorState, convoys: list[str]) -> bool:
    """Slung again after an unsling: the auto-convoy of its first sling still tracks it; no second one."""
    return any((c := state.convoys.get(cid)) is not None and c.auto and c.status == "open" for cid in convoys)


def _rig_taking_work(state: MayorState, name: str) -> KnownRig:
    """The rig a sling names; a rig nobody added, or one removed, takes nothing (a parked one takes work that
    waits)."""
    rig = state.rigs.get(name)
    if rig is not None and not rig.removed:
        return rig
    live = sorted(r.name for r in state.rigs.values() if not r.removed)
    rigs = f"rigs: {', '.join(live)}" if live else "no rigs yet; add one with gt rig add"
    if rig is not None:
        raise CommandError("not_found", f"rig {name!r} was removed; {rigs}")
    raise CommandError("not_found", f"no rig {name!r}; {rigs}")


def unsling(state: MayorState, cmd: BeadUnsling) -> Accepted[SlingResult]:
    """hooked or in_progress -> open, off its rig; the molecule keeps its done steps (see ``bead.unslung``)."""
    bead = get_bead(state, cmd.id)
    if bead.status == "closed":
        raise CommandError("backward_transition", f"bead {bead.id} is closed; a closed bead has no hook to release")
    hold = state.holds.get(bead.id)
    if bead.status not in WORKING and hold is None:
        raise CommandError("conflict", f"bead {bead.id} is not hooked (it is {bead.status}); nothing to unsling")
    # A held bead (open, waiting for its blockers) gives its hold back: the mayor will not sling it.
    rig, was = (hold.rig, "held") if hold is not None else (bead.rig or "", bead.status)
    event = BeadUnslung(bead_id=bead.id, rig=rig, reason=cmd.reason, remove_worktree=cmd.remove_worktree)
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=bead.version)],
        result=SlingResult(id=bead.id, status="open", changed=True, rig=rig, was=was),
    )


def _attach(bead_id: str, bead_title: str, cmd: BeadSling, looked_up: object) -> NewEvent:
    if isinstance(looked_up, FormulaError):
        raise CommandError("invalid", str(looked_up)) from looked_up
    if not isinstance(looked_up, Formula):
        # A bug, not bad input: the intake runs prepare() before every decision.
        raise TypeError(f"sling of {bead_id} decided without its formula: MayorService.prepare looks it up")
    formula = looked_up
    try:
        steps, used = cook(formula, cmd.vars, {"bead": bead_id, "bead_title": bead_title, "rig": cmd.rig})
    except FormulaError as exc:
        raise CommandError("invalid", str(exc)) from exc
    attached = MoleculeAttached(
        bead_id=bead_id,
        formula=formula.name,
        formula_version=formula.version,
        source=formula.source,
        vars=used,
        steps=steps,
    )
    return NewEvent(payload=attached, expected_seq=0)


def _formula_name(events: list[NewEvent]) -> str | None:
    for event in events:
        if isinstance(event.payload, MoleculeAttached):
            return event.payload.formula
    return None


def _molecule_step(state: MayorState, bead_id: str, step_id: str) -> tuple[Molecule, Step]:
    bead = get_bead(state, bead_id, field="bead")
    molecule = state.molecules.get(bead_id)
    if molecule is None and bead.collected_molecule is not None:
        raise CommandError(
            "conflict",
            f"bead {bead_id} is closed and its {bead.collected_molecule} molecule was garbage-collected; it can no "
            f"longer change (`gt bead history {bead_id}` shows its steps from the log)",
        )
    if molecule is None:
        raise CommandError("not_found", f"bead {bead_id} has no molecule (sling it with a formula first)")
    if bead.status == "closed":
        raise CommandError("conflict", f"bead {bead_id} is closed; its molecule can no longer change")
    for step in molecule.steps:
        if step.id == step_id:
            return molecule, step
    known = ", ".join(s.id for s in molecule.steps)
    raise CommandError("not_found", f"the molecule of {bead_id} has no step {step_id!r} (its steps: {known})")


def _check_needs(molecule: Molecule, step: Step) -> None:
    missing = unmet_needs(molecule, step)
    if missing:
        raise CommandError("invalid", f"step {step.id!r} needs {', '.join(missing)} done first")
    if step.wait is not None and step.gate_closed():
        raise CommandError(
            "gate_closed",
            f"step {step.id!r} of {molecule.bead_id} waits on its gate, {gates.describe(step.wait)}: "
            f"{gates.how_to_open(molecule.bead_id, step.id, step.wait)}. Nothing to do on it until then: stop here "
            "(a fresh session continues the bead when the gate opens)",
        )


def _step_result(molecule: Molecule, step_id: str, status: str, *, changed: bool) -> StepResult:
    done = sum(1 for s in molecule.steps if s.status == "done" or (s.id == step_id and status == "done"))
    return StepResult(
        bead=molecule.bead_id, step=step_id, status=status, changed=changed, done=done, total=len(molecule.steps)
    )


def gate_open(state: MayorState, cmd: GateApprove | GateOpen, ctx: DecideContext) -> Accepted[GateResult]:
    """Open a step's gate, once: an operator's approval (any kind of gate), or the deacon's word that a ``ci`` gate's
    check exited 0. A gate opened already is a no-op; a step without a gate, or one done, is refused; so is an
    approval from a polecat (its NATS user may not send one either) and an opening from anyone but the deacon."""
    by: GateOpener = "operator" if isinstance(cmd, GateApprove) else "ci"
    if by == "operator" and ctx.actor.startswith(POLECAT_PREFIX):
        raise CommandError("unauthorized", "a polecat cannot open a gate: an operator approves it")
    if by == "ci" and ctx.actor != "deacon":
        raise CommandError(
            "unauthorized", "gate.open is the deacon's (a CI check passed); an operator runs `gt gate approve`"
        )
    molecule, step = _molecule_step(state, cmd.bead, cmd.step)
    if step.wait is None:
        raise CommandError("invalid", f"step {step.id!r} of {cmd.bead} has no gate (the formula gives it no `wait`)")
    if by == "ci" and not isinstance(step.wait, CiGate):
        raise CommandError("invalid", f"the gate of step {step.id!r} of {cmd.bead} is {gates.describe(step.wait)}")
    if not step.gate_closed():
        return Accepted(result=GateResult(bead=cmd.bead, step=step.id, by=step.gate_opened_by or "", changed=False))
    if step.status == "done":
        raise CommandError("conflict", f"step {step.id!r} of {cmd.bead} is done; its gate no longer matters")
    detail = cmd.note if isinstance(cmd, GateApprove) else cmd.output[-gates.CI_OUTPUT_SHOWN :]
    event = GateOpened(bead_id=cmd.bead, step=step.id, by=by, detail=detail)
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=molecule.version)],
        result=GateResult(bead=cmd.bead, step=step.id, by=by),
    )


def step_start(state: MayorState, cmd: StepStart) -> Accepted[StepResult]:
    molecule, step = _molecule_step(state, cmd.bead, cmd.step)
    if step.status == "done":
        raise CommandError("backward_transition", f"step {step.id!r} of {cmd.bead} is done; it is never redone")
    if step.status == "in_progress":
        return Accepted(result=_step_result(molecule, step.id, "in_progress", changed=False))
    _check_needs(molecule, step)
    event = NewEvent(payload=StepStarted(bead_id=cmd.bead, step=step.id), expected_seq=molecule.version)
    return Accepted(events=[event], result=_step_result(molecule, step.id, "in_progress", changed=True))


def step_done(state: MayorState, cmd: StepDone) -> Accepted[StepResult]:
    molecule, step = _molecule_step(state, cmd.bead, cmd.step)
    if step.status == "done":
        return Accepted(result=_step_result(molecule, step.id, "done", changed=False))
    _check_needs(molecule, step)
    events = [NewEvent(payload=StepCompleted(bead_id=cmd.bead, step=step.id), expected_seq=molecule.version)]
    others_done = all(s.status == "done" for s in molecule.steps if s.id != step.id)
    # Once per molecule: the last step of a rework round appended after it completed does not complete it again.
    if others_done and molecule.completed_at is None:
        events.append(NewEvent(payload=MoleculeCompleted(bead_id=cmd.bead), expected_seq=None))
    out = _step_result(molecule, step.id, "done", changed=True)
    out.complete = others_done
    return Accepted(events=events, result=out)
