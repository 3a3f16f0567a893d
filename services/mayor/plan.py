"""What the mayor owes without being asked: slinging held beads whose blockers closed, closing finished convoys,
closing escalations whose cause was resolved, re-escalating ignored ones, appending rework steps to the molecule
of a bead whose work was sent back, opening timer gates whose time came.

Level-triggered and pure: from the state (and the time, passed in) to the events still owed. Each event
carries its aggregate's expected sequence, so a decision taken twice (two ticks, or before and after a
restart) is stored at most once.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from services.mayor.state import Escalation, MayorState, convoy_progress, current_step, open_blockers
from shared.model import gates
from shared.model.commands import SEVERITIES
from shared.model.decision import NewEvent
from shared.model.events import (
    BeadSlung,
    ConvoyClosed,
    EscalationClosed,
    EscalationReescalated,
    GateOpened,
    ReworkAdded,
)
from shared.model.formulas import rework

MAX_REESCALATIONS = 2
RESOLVER = "mayor"
"""Who an escalation closed by itself is closed by (``escalation.closed``'s ``by``)."""


def released_holds(state: MayorState) -> list[NewEvent]:
    """A held bead, still open, whose blockers are all closed (however they closed: closed is closed) is slung
    to the rig it was held for. Its molecule was cooked when it was held. The bead's expected sequence makes
    the sling single even when two reconciles (or one before and one after a restart) both see it owed."""
    owed = []
    for bead_id, hold in state.holds.items():
        bead = state.beads.get(bead_id)
        if bead is None or bead.status != "open" or open_blockers(state, bead):
            continue
        if (rig := state.rigs.get(hold.rig)) is None or rig.removed:
            continue  # never to a rig taken out of service: it stays held until slung elsewhere or unslung
        event = BeadSlung(bead_id=bead_id, rig=hold.rig, held_for=list(hold.blockers), agent=hold.agent)
        owed.append(NewEvent(payload=event, expected_seq=bead.version))
    return owed


def convoy_closures(state: MayorState) -> list[NewEvent]:
    """An open convoy that is not owned, tracks at least one bead, and whose beads are all closed."""
    owed = []
    for convoy_id in state.open_convoys:
        convoy = state.convoys[convoy_id]
        if convoy.owned or not convoy.beads:
            continue
        closed, total = convoy_progress(state, convoy)
        if closed == total:
            event = ConvoyClosed(convoy_id=convoy.id, closed_beads=closed, total_beads=total)
            owed.append(NewEvent(payload=event, expected_seq=convoy.version))
    return owed


def resolution(state: MayorState, escalation: Escalation) -> str | None:
    """What resolved the escalation, in words, or None: a bead it names closed, a service it names up, or what an
    event after it was raised resolved (its merge request merged, a session done on its rig)."""
    if escalation.resolved is not None:
        return escalation.resolved
    for entry in escalation.resolved_when:
        kind, _, what = entry.partition(":")
        if kind == "bead" and (bead := state.beads.get(what)) is not None and bead.status == "closed":
            why = f": {bead.close_reason}" if bead.close_reason else ""
            return f"bead {what} closed{why}"
        if kind == "service" and state.services.get(what) == "up":
            return f"service {what} is up again"
    return None


def resolutions(state: MayorState) -> list[NewEvent]:
    """An escalation still open (or acknowledged) that its raiser said resolves by itself, once it has: closed
    by the mayor with the reason (an operator's own escalations say nothing, and stay open)."""
    owed = []
    for escalation in state.escalations.values():
        if escalation.status == "closed" or not escalation.resolved_when:
            continue
        how = resolution(state, escalation)
        if how is not None:
            event = EscalationClosed(escalation_id=escalation.id, by=RESOLVER, reason=f"resolved: {how}"[:4096])
            owed.append(NewEvent(payload=event, expected_seq=escalation.version))
    return owed


def reescalations(state: MayorState, now: datetime, stale_after: timedelta) -> list[NewEvent]:
    """An open, unacknowledged escalation raised (or last re-escalated) ``stale_after`` ago goes one
    severity up, at most twice, never past critical."""
    owed = []
    for escalation in state.escalations.values():
        if escalation.status != "open" or escalation.reescalations >= MAX_REESCALATIONS:
            continue
        rank = SEVERITIES.index(escalation.severity)
        if rank == len(SEVERITIES) - 1 or now - escalation.last_raised_at < stale_after:
            continue
        event = EscalationReescalated(
            escalation_id=escalation.id,
            from_severity=escalation.severity,
            to_severity=SEVERITIES[rank + 1],
            level=escalation.reescalations + 1,
        )
        owed.append(NewEvent(payload=event, expected_seq=escalation.version))
    return owed


def rework_owed(state: MayorState) -> list[NewEvent]:
    """A bead whose work the merge queue sent back (and that has not submitted again) gets a round of rework steps
    appended to its molecule: its current step becomes the first of them, so its next session is told to rework,
    not to run `gt done`. The round answers the send-back by its event's id (the fold settles it), and the
    molecule's expected sequence stores it once when two reconciles, or one before and one after a restart, both
    see it owed. A bead without a molecule is worked as one step: it has none to append to."""
    owed = []
    for bead_id, sent in state.send_backs.items():
        molecule = state.molecules.get(bead_id)
        if molecule is None:
            continue
        round_ = rework.next_round(s.id for s in molecule.steps)
        steps = rework.rework_steps(
            round_,
            mr=sent.mr,
            reason=sent.reason,
            branch=sent.branch,
            target=sent.target,
            target_commit=sent.target_commit,
            files=sent.files,
            exit_code=sent.exit_code,
            tail=sent.tail,
        )
        event = ReworkAdded(
            bead_id=bead_id, mr_id=sent.mr, sent_back_by=sent.event, round=round_, reason=sent.reason, steps=steps
        )
        owed.append(NewEvent(payload=event, expected_seq=molecule.version))
    return owed


def timer_openings(state: MayorState, now: datetime) -> list[NewEvent]:
    """A timer gate whose step has waited its time (``gates.opens_at``), on a bead not closed, opens: one event per
    molecule per pass, under its molecule's expected sequence, so two passes (or one before and one after a
    restart) store it once."""
    owed = []
    for bead_id, molecule in state.molecules.items():
        bead = state.beads.get(bead_id)
        if bead is None or bead.status == "closed":
            continue
        current = current_step(molecule)
        for step in molecule.steps:
            if step.wait is None or not step.gate_closed() or step is not current:
                continue
            due = gates.opens_at(step.wait, step.waiting_since)
            if due is not None and due <= now:
                event = GateOpened(bead_id=bead_id, step=step.id, by="timer")
                owed.append(NewEvent(payload=event, expected_seq=molecule.version))
                break  # the next one (if any) on a later pass: this one moves the molecule's sequence
    return owed


def owed(state: MayorState, now: datetime, stale_after: timedelta) -> list[NewEvent]:
    closing = resolutions(state)
    closed = {new.payload.aggregate_id() for new in closing}
    # A closing escalation is not raised a severity too: both would carry the same expected sequence.
    raising = [new for new in reescalations(state, now, stale_after) if new.payload.aggregate_id() not in closed]
    return (
        released_holds(state)
        + convoy_closures(state)
        + closing
        + raising
        + rework_owed(state)
        + timer_openings(state, now)
    )
