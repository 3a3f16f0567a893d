"""The mayor's projection: the fold of every event it tracks into ``MayorState``. Pure: no I/O, no clock."""

from __future__ import annotations

import functools
from datetime import datetime

import msgspec

from services.mayor.state import (
    WISP_TYPE,
    Bead,
    Convoy,
    Escalation,
    Hold,
    KnownRig,
    MayorState,
    MergeRef,
    Molecule,
    SendBack,
    SessionCost,
    Step,
    UsageBook,
    current_step,
)
from shared.model.events import (
    BeadClaimed,
    BeadClosed,
    BeadCreated,
    BeadHeld,
    BeadSlung,
    BeadUnslung,
    BeadUpdated,
    CommandAccepted,
    CommandRejected,
    ConvoyBeadsAdded,
    ConvoyClosed,
    ConvoyCreated,
    Envelope,
    EscalationAcked,
    EscalationClosed,
    EscalationRaised,
    EscalationReescalated,
    Event,
    GateOpened,
    GcSwept,
    MergeRequestConflicted,
    MergeRequestFailed,
    MergeRequestMerged,
    MergeRequestRejected,
    MergeRequestRequeued,
    MergeRequestSubmitted,
    MoleculeAttached,
    MoleculeCompleted,
    ReworkAdded,
    RigAdded,
    RigParked,
    RigRemoved,
    RigUnparked,
    ServiceDown,
    ServiceStopped,
    ServiceUp,
    SessionEnded,
    SessionRequested,
    SessionUsage,
    StepCompleted,
    StepSpec,
    StepStarted,
)
from shared.model.events.beads import WORKING, forward
from shared.model.fold import advance, touch
from shared.model.formulas.rework import CONFLICT
from shared.model.usage import difference, merge
from shared.service.projection import Projection

SCHEMA_VERSION = 7
"""3: rigs and their polecats, held slings (a snapshot from before knows none, so it is not trusted). Sessions'
token usage needs no new version: a snapshot from before it cannot have skipped a ``session.usage``. 4: merge
requests and send-backs (``merge_requests``, ``send_backs``): a snapshot from before skipped every ``mr.*`` event,
so it would owe no rework for a send-back it never saw. 5: services'
status and what resolves escalations by themselves (a snapshot from before skipped the events they come from).
7: beads' and holds' ``agent`` (``gt sling --agent``): a snapshot an older mayor made may have folded a sling's
agent without keeping it."""


@functools.singledispatch
def fold(payload: Event, state: MayorState, env: Envelope, seq: int) -> None:
    """Events the mayor does not track change nothing."""


# ---- beads -------------------------------------------------------------------------------------


def _bead(state: MayorState, bead_id: str, env: Envelope, seq: int) -> Bead | None:
    """The bead an event is about (see ``touch``), updated at the event's time."""
    bead = touch(state.beads, bead_id, seq)
    if bead is not None:
        bead.updated_at = env.ts
    return bead


@fold.register
def _created(payload: BeadCreated, state: MayorState, env: Envelope, seq: int) -> None:
    if payload.bead_id in state.beads:
        return  # the log's expected-sequence check makes this impossible; a fold still never double-counts
    state.beads[payload.bead_id] = Bead(
        id=payload.bead_id,
        title=payload.title,
        type=payload.type,
        priority=payload.priority,
        description=payload.description,
        labels=list(payload.labels),
        metadata=dict(payload.metadata),
        assignee=payload.assignee,
        parent=payload.parent,
        needs=list(payload.needs),
        created_at=env.ts,
        updated_at=env.ts,
        created_by=env.actor,
        version=seq,
    )
    if payload.parent:
        state.children.setdefault(payload.parent, []).append(payload.bead_id)


@fold.register
def _updated(payload: BeadUpdated, state: MayorState, env: Envelope, seq: int) -> None:
    if (bead := _bead(state, payload.bead_id, env, seq)) is None:
        return
    if payload.title is not msgspec.UNSET:
        bead.title = payload.title
    if payload.type is not msgspec.UNSET:
        bead.type = payload.type
    if payload.priority is not msgspec.UNSET:
        bead.priority = payload.priority
    if payload.description is not msgspec.UNSET:
        bead.description = payload.description
    if payload.assignee is not msgspec.UNSET:
        bead.assignee = payload.assignee
    if payload.parent is not msgspec.UNSET and payload.parent != bead.parent:
        siblings = state.children.get(bead.parent or "", [])
        if bead.id in siblings:
            siblings.remove(bead.id)
            if not siblings:
                del state.children[bead.parent or ""]
        bead.parent = payload.parent
        if payload.parent:
            state.children.setdefault(payload.parent, []).append(bead.id)
    # Adds before removes, as the bead store contract has it.
    for label in payload.add_labels:
        if label not in bead.labels:
            bead.labels.append(label)
    if payload.remove_labels:
        bead.labels = [label for label in bead.labels if label not in payload.remove_labels]
    if payload.metadata:
        bead.metadata.update(payload.metadata)
    for need in payload.add_needs:
        if need not in bead.needs:
            bead.needs.append(need)
    if payload.remove_needs:
        bead.needs = [need for need in bead.needs if need not in payload.remove_needs]


@fold.register
def _claimed(payload: BeadClaimed, state: MayorState, env: Envelope, seq: int) -> None:
    if (bead := _bead(state, payload.bead_id, env, seq)) is None:
        return
    bead.status = forward(bead.status, "in_progress")
    state.holds.pop(bead.id, None)  # only open beads are held
    bead.assignee = payload.assignee


@fold.register
def _closed(payload: BeadClosed, state: MayorState, env: Envelope, seq: int) -> None:
    if (bead := _bead(state, payload.bead_id, env, seq)) is None:
        return
    if bead.status != "closed":
        bead.status = "closed"
        bead.closed_at = env.ts
        bead.close_reason = payload.reason
    state.holds.pop(bead.id, None)
    state.send_backs.pop(bead.id, None)  # nothing is owed to a closed bead: its molecule can no longer change
    for mr_id in [m for m, ref in state.merge_requests.items() if ref.bead == bead.id]:
        del state.merge_requests[mr_id]


@fold.register
def _slung(payload: BeadSlung, state: MayorState, env: Envelope, seq: int) -> None:
    if (bead := _bead(state, payload.bead_id, env, seq)) is None:
        return
    bead.status = forward(bead.status, "hooked")
    bead.rig = payload.rig
    bead.hook_session = payload.session
    if payload.agent is not None:
        bead.agent = payload.agent  # the bead's choice from now on; a sling naming none keeps it
    bead.slings += 1
    state.holds.pop(bead.id, None)  # slung: by the hold's release, or by hand (forced) before it
    _arm_gate(state, bead.id, env.ts)  # a molecule cooked at a hold: its current gate waits from now


@fold.register
def _held(payload: BeadHeld, state: MayorState, env: Envelope, seq: int) -> None:
    if (bead := _bead(state, payload.bead_id, env, seq)) is None:
        return
    if bead.status == "open":
        state.holds[bead.id] = Hold(rig=payload.rig, blockers=list(payload.blockers), since=env.ts, agent=payload.agent)


@fold.register
def _unslung(payload: BeadUnslung, state: MayorState, env: Envelope, seq: int) -> None:
    """The hook (or a held bead's hold) is given back: open again, on no rig, and a claim's assignee with it (the
    polecat no longer works on it). The molecule and its done steps stay as they are."""
    if (bead := _bead(state, payload.bead_id, env, seq)) is None:
        return
    if bead.status == "in_progress":
        bead.assignee = None
    if bead.status in WORKING:
        bead.status = "open"
        bead.rig = None
        bead.hook_session = None
    state.holds.pop(bead.id, None)  # a held bead gives its hold back


# ---- rigs (the witness's events) ---------------------------------------------------------------


@fold.register
def _rig_added(payload: RigAdded, state: MayorState, env: Envelope, seq: int) -> None:
    known = state.rigs.get(payload.rig)
    if known is None or known.removed:
        # Added again after its removal: a new rig under the old name, none of the old one's polecats, and no
        # bead held for the old one is slung to it (such a bead is open, held no more).
        state.rigs[payload.rig] = KnownRig(name=payload.rig)
        for bead_id in [b for b, hold in state.holds.items() if hold.rig == payload.rig] if known else []:
            del state.holds[bead_id]


@fold.register
def _rig_parked(payload: RigParked, state: MayorState, env: Envelope, seq: int) -> None:
    if (rig := state.rigs.get(payload.rig)) is not None:
        rig.parked = True


@fold.register
def _rig_unparked(payload: RigUnparked, state: MayorState, env: Envelope, seq: int) -> None:
    if (rig := state.rigs.get(payload.rig)) is not None and not rig.removed:
        rig.parked = False


@fold.register
def _rig_removed(payload: RigRemoved, state: MayorState, env: Envelope, seq: int) -> None:
    if (rig := state.rigs.get(payload.rig)) is not None:
        rig.parked = rig.removed = True


# ---- molecules ---------------------------------------------------------------------------------


@fold.register
def _attached(payload: MoleculeAttached, state: MayorState, env: Envelope, seq: int) -> None:
    if payload.bead_id in state.molecules:
        return
    state.molecules[payload.bead_id] = Molecule(
        bead_id=payload.bead_id,
        formula=payload.formula,
        formula_version=payload.formula_version,
        source=payload.source,
        vars=dict(payload.vars),
        steps=[_step_of(s) for s in payload.steps],
        attached_at=env.ts,
        version=seq,
    )
    _arm_gate(state, payload.bead_id, env.ts)


def _step_of(spec: StepSpec) -> Step:
    return Step(
        id=spec.id,
        title=spec.title,
        description=spec.description,
        needs=list(spec.needs),
        acceptance=spec.acceptance,
        wait=spec.wait,
    )


def _arm_gate(state: MayorState, bead_id: str, at: datetime) -> None:
    """The current step's closed gate starts waiting at ``at``, the time of the event that made it current, once its
    bead is slung (a held bead's molecule is cooked at the hold: its timer runs from the sling)."""
    molecule, bead = state.molecules.get(bead_id), state.beads.get(bead_id)
    if molecule is None or bead is None or bead.status not in WORKING:
        return
    step = current_step(molecule)
    if step is not None and step.gate_closed() and step.waiting_since is None:
        step.waiting_since = at


def _step(state: MayorState, bead_id: str, step_id: str, seq: int) -> Step | None:
    """The step an event is about; its molecule's version moved to the event (when the molecule has the step)."""
    molecule = state.molecules.get(bead_id)
    if molecule is None:
        return None
    for step in molecule.steps:
        if step.id == step_id:
            molecule.version = seq
            return step
    return None


@fold.register
def _step_started(payload: StepStarted, state: MayorState, env: Envelope, seq: int) -> None:
    step = _step(state, payload.bead_id, payload.step, seq)
    if step is not None and step.status == "pending":
        step.status = "in_progress"
        step.started_at = env.ts


@fold.register
def _step_done(payload: StepCompleted, state: MayorState, env: Envelope, seq: int) -> None:
    step = _step(state, payload.bead_id, payload.step, seq)
    if step is not None and step.status != "done":
        step.status = "done"
        step.started_at = step.started_at or env.ts
        step.done_at = env.ts
        step.done_by = env.actor
        _arm_gate(state, payload.bead_id, env.ts)


@fold.register
def _gate_opened(payload: GateOpened, state: MayorState, env: Envelope, seq: int) -> None:
    step = _step(state, payload.bead_id, payload.step, seq)
    if step is not None and step.gate_closed():
        step.gate_opened_at = env.ts
        step.gate_opened_by = payload.by
        step.gate_opener = env.actor
        step.gate_detail = payload.detail


@fold.register
def _molecule_completed(payload: MoleculeCompleted, state: MayorState, env: Envelope, seq: int) -> None:
    if (molecule := touch(state.molecules, payload.bead_id, seq)) is not None:
        molecule.completed_at = molecule.completed_at or env.ts


@fold.register
def _rework_added(payload: ReworkAdded, state: MayorState, env: Envelope, seq: int) -> None:
    """Appended after the last step, all pending; a step id the molecule has already is never added again (nor
    reset: a done step stays done). The send-back it answers is settled."""
    if (molecule := touch(state.molecules, payload.bead_id, seq)) is None:
        return
    present = {s.id for s in molecule.steps}
    molecule.steps.extend(_step_of(s) for s in payload.steps if s.id not in present)
    _arm_gate(state, payload.bead_id, env.ts)
    owed = state.send_backs.get(payload.bead_id)
    if owed is not None and owed.event == payload.sent_back_by:
        del state.send_backs[payload.bead_id]


# ---- merge requests (the refinery's events): send-backs owe rework steps ----------------------------


@fold.register
def _mr_submitted(payload: MergeRequestSubmitted, state: MayorState, env: Envelope, seq: int) -> None:
    bead = state.beads.get(payload.bead)
    if bead is None or bead.status == "closed":
        return
    state.merge_requests[payload.mr_id] = MergeRef(bead=bead.id, branch=payload.branch, target=payload.target)
    _settle_send_back(state, bead.id)  # the bead submitted again: whatever was sent back is handed in


def _settle_send_back(state: MayorState, bead_id: str, mr_id: str | None = None) -> None:
    """The bead's send-back (of merge request ``mr_id``, or any) owes nothing any more."""
    owed = state.send_backs.get(bead_id)
    if owed is not None and (mr_id is None or owed.mr == mr_id):
        del state.send_backs[bead_id]


def _open_ref(state: MayorState, mr_id: str) -> MergeRef | None:
    """The merge request's bead and branches, when its bead is known and not closed."""
    ref = state.merge_requests.get(mr_id)
    bead = state.beads.get(ref.bead) if ref is not None else None
    return ref if bead is not None and bead.status != "closed" else None


@fold.register
def _mr_conflicted(payload: MergeRequestConflicted, state: MayorState, env: Envelope, seq: int) -> None:
    # Not sent back: a conflict bead for the operator blocks it, and no agent is sent anything.
    if payload.sent_back and (ref := _open_ref(state, payload.mr_id)) is not None:
        state.send_backs[ref.bead] = SendBack(
            mr=payload.mr_id,
            event=env.id,
            reason=CONFLICT,
            files=list(payload.files),
            target_commit=payload.target_commit,
            branch=ref.branch,
            target=ref.target,
        )


@fold.register
def _mr_failed(payload: MergeRequestFailed, state: MayorState, env: Envelope, seq: int) -> None:
    # Escalated: the operator's, not the agent's.
    if not payload.escalated and (ref := _open_ref(state, payload.mr_id)) is not None:
        state.send_backs[ref.bead] = SendBack(
            mr=payload.mr_id,
            event=env.id,
            reason=payload.gate,
            exit_code=payload.exit_code,
            tail=payload.tail,
            branch=ref.branch,
            target=ref.target,
        )


@fold.register
def _mr_requeued(payload: MergeRequestRequeued, state: MayorState, env: Envelope, seq: int) -> None:
    """Back in the queue (the bead resubmitted the same commit, or an operator retried it): nothing to rework."""
    if (ref := state.merge_requests.get(payload.mr_id)) is not None:
        _settle_send_back(state, ref.bead, payload.mr_id)


@fold.register
def _mr_rejected(payload: MergeRequestRejected, state: MayorState, env: Envelope, seq: int) -> None:
    """Taken out of the queue by an operator: nobody works the bead until someone decides."""
    if (ref := state.merge_requests.get(payload.mr_id)) is not None:
        _settle_send_back(state, ref.bead, payload.mr_id)


# ---- convoys -----------------------------------------------------------------------------------


def _track(state: MayorState, convoy: Convoy, bead_ids: list[str]) -> None:
    for bead_id in bead_ids:
        if bead_id in convoy.beads:
            continue
        convoy.beads.append(bead_id)
        bead = state.beads.get(bead_id)
        if bead is not None and convoy.id not in bead.convoys:
            bead.convoys.append(convoy.id)


@fold.register
def _convoy_created(payload: ConvoyCreated, state: MayorState, env: Envelope, seq: int) -> None:
    if payload.convoy_id in state.convoys:
        return
    convoy = Convoy(
        id=payload.convoy_id,
        title=payload.title,
        owned=payload.owned,
        auto=payload.auto,
        created_at=env.ts,
        created_by=env.actor,
        version=seq,
    )
    state.convoys[convoy.id] = convoy
    state.open_convoys.append(convoy.id)
    _track(state, convoy, payload.beads)


@fold.register
def _convoy_added(payload: ConvoyBeadsAdded, state: MayorState, env: Envelope, seq: int) -> None:
    if (convoy := touch(state.convoys, payload.convoy_id, seq)) is not None:
        _track(state, convoy, payload.beads)


@fold.register
def _convoy_closed(payload: ConvoyClosed, state: MayorState, env: Envelope, seq: int) -> None:
    if (convoy := advance(state.convoys, payload.convoy_id, seq, "closed")) is not None:
        convoy.closed_at, convoy.landed, convoy.forced = env.ts, payload.landed, payload.forced
        if convoy.id in state.open_convoys:
            state.open_convoys.remove(convoy.id)


# ---- escalations -------------------------------------------------------------------------------


@fold.register
def _escalation_raised(payload: EscalationRaised, state: MayorState, env: Envelope, seq: int) -> None:
    if payload.escalation_id in state.escalations:
        return
    state.escalations[payload.escalation_id] = Escalation(
        id=payload.escalation_id,
        severity=payload.severity,
        original_severity=payload.severity,
        source=payload.source,
        message=payload.message,
        bead=payload.bead,
        resolved_when=list(payload.resolved_when),
        raised_at=env.ts,
        last_raised_at=env.ts,
        version=seq,
    )


@fold.register
def _escalation_acked(payload: EscalationAcked, state: MayorState, env: Envelope, seq: int) -> None:
    if (escalation := advance(state.escalations, payload.escalation_id, seq, "acked", only_from=("open",))) is not None:
        escalation.acked_at, escalation.acked_by = env.ts, payload.by


@fold.register
def _escalation_reescalated(payload: EscalationReescalated, state: MayorState, env: Envelope, seq: int) -> None:
    if (escalation := touch(state.escalations, payload.escalation_id, seq)) is not None:
        escalation.severity = payload.to_severity
        escalation.reescalations = max(escalation.reescalations, payload.level)
        escalation.last_raised_at = env.ts


@fold.register
def _escalation_closed(payload: EscalationClosed, state: MayorState, env: Envelope, seq: int) -> None:
    if (escalation := advance(state.escalations, payload.escalation_id, seq, "closed")) is not None:
        escalation.closed_at, escalation.closed_by, escalation.close_reason = env.ts, payload.by, payload.reason


# ---- garbage collection ------------------------------------------------------------------------


def _closed_before(bead: Bead, cutoff: datetime) -> bool:
    return bead.status == "closed" and bead.closed_at is not None and bead.closed_at < cutoff


@fold.register
def _gc_swept(payload: GcSwept, state: MayorState, env: Envelope, seq: int) -> None:
    """The molecules of beads closed before the cutoff leave (the bead keeps the formula's name), and so do
    closed wisps nothing refers to (no bead needs it, no convoy tracks it, it has no children). Other beads
    stay: they are the town's record and what ``needs`` and convoys point at."""
    cutoff = payload.cutoff
    for bead_id in list(state.molecules):
        bead = state.beads.get(bead_id)
        if bead is not None and _closed_before(bead, cutoff):
            bead.collected_molecule = state.molecules.pop(bead_id).formula
    wisps = [b for b in state.beads.values() if b.type == WISP_TYPE and _closed_before(b, cutoff)]
    if not wisps:
        return
    referenced = {need for bead in state.beads.values() for need in bead.needs}
    referenced.update(bead_id for convoy in state.convoys.values() for bead_id in convoy.beads)
    for wisp in wisps:
        if wisp.id in referenced or state.children.get(wisp.id):
            continue
        del state.beads[wisp.id]
        siblings = state.children.get(wisp.parent or "")
        if siblings is not None and wisp.id in siblings:
            siblings.remove(wisp.id)
            if not siblings:
                del state.children[wisp.parent or ""]


# ---- outcomes ----------------------------------------------------------------------------------


@fold.register
def _accepted(payload: CommandAccepted, state: MayorState, env: Envelope, seq: int) -> None:
    state.commands_accepted += 1


@fold.register
def _rejected(payload: CommandRejected, state: MayorState, env: Envelope, seq: int) -> None:
    state.commands_rejected += 1


# ---- polecats (the witness's events), for mail addresses -----------------------------------------


@fold.register
def _session_requested(payload: SessionRequested, state: MayorState, env: Envelope, seq: int) -> None:
    if (rig := state.rigs.get(payload.rig)) is not None:
        rig.polecats[payload.polecat] = payload.session_id
    # The session on the bead's hook now, and once it is closed the last that worked it (`gt bead show`'s
    # `session:`): the witness's event, so the bead's own version does not move.
    if (bead := state.beads.get(payload.bead)) is not None and bead.status != "closed":
        bead.hook_session = payload.session_id


@fold.register
def _session_ended(payload: SessionEnded, state: MayorState, env: Envelope, seq: int) -> None:
    # A rig has a few polecats at a time (its max_polecats): looking through them beats keeping every session.
    for rig in state.rigs.values():
        for polecat, session in rig.polecats.items():
            if session == payload.session_id:
                rig.polecats[polecat] = None
                if payload.reason == "done":
                    _resolve(state, f"rig:{rig.name}", f"session {session} of rig {rig.name} finished its work")
                return


# ---- what resolves escalations by itself ---------------------------------------------------------


def _resolve(state: MayorState, what: str, how: str) -> None:
    """Open escalations resolved by ``what`` (a ``resolved_when`` entry) learn how; the plan closes them."""
    for escalation in state.escalations.values():
        if escalation.status != "closed" and escalation.resolved is None and what in escalation.resolved_when:
            escalation.resolved = how


@fold.register
def _mr_merged(payload: MergeRequestMerged, state: MayorState, env: Envelope, seq: int) -> None:
    _resolve(state, f"mr:{payload.mr_id}", f"merge request {payload.mr_id} merged")


@fold.register
def _service_up(payload: ServiceUp, state: MayorState, env: Envelope, seq: int) -> None:
    state.services[payload.service] = "up"


@fold.register
def _service_down(payload: ServiceDown, state: MayorState, env: Envelope, seq: int) -> None:
    state.services[payload.service] = "down"


@fold.register
def _service_stopped(payload: ServiceStopped, state: MayorState, env: Envelope, seq: int) -> None:
    state.services[payload.service] = "stopped"


@fold.register
def _session_usage(payload: SessionUsage, state: MayorState, env: Envelope, seq: int) -> None:
    fold_usage(state.usage, payload, env.ts)


def fold_usage(book: UsageBook, event: SessionUsage, ts: datetime) -> None:
    """A ``session.usage`` event holds the session's running totals: the newest is kept per session, and what the
    session used since its previous event (the difference) counts for the day of this one."""
    before = book.sessions.get(event.session_id)
    used = difference(event.models, before.models if before else ())
    merge(book.days.setdefault(ts.date().isoformat(), {}), [u for u in used if u.messages or u.tokens])
    book.sessions[event.session_id] = SessionCost(
        rig=event.rig, bead=event.bead, models=event.models, final=event.final
    )


def new_projection() -> Projection[MayorState]:
    return Projection(
        "mayor", MayorState, fold, schema_version=SCHEMA_VERSION, snapshot_after=frozenset({GcSwept.TYPE})
    )
