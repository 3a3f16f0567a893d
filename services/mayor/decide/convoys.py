"""Decisions on convoys: create, add beads, land. Auto-close is owed by ``plan``. Pure."""

from __future__ import annotations

from services.mayor.decide.beads import fresh_id, get_bead
from services.mayor.state import Convoy, MayorState, convoy_progress
from shared.core.errors import CommandError
from shared.core.ids import CONVOY_PREFIX
from shared.model.commands import ConvoyAdd, ConvoyCreate, ConvoyLand
from shared.model.decision import Accepted, DecideContext, NewEvent
from shared.model.events import ConvoyBeadsAdded, ConvoyClosed, ConvoyCreated
from shared.model.results import ConvoyResult


def get_convoy(state: MayorState, convoy_id: str) -> Convoy:
    convoy = state.convoys.get(convoy_id)
    if convoy is None:
        raise CommandError("not_found", f"no convoy {convoy_id!r}")
    return convoy


def _progress(state: MayorState, convoy_id: str, beads: list[str], *, status: str, changed: bool) -> ConvoyResult:
    closed = sum(1 for b in beads if (bead := state.beads.get(b)) is not None and bead.status == "closed")
    return ConvoyResult(id=convoy_id, status=status, changed=changed, closed=closed, total=len(beads))


def create(state: MayorState, cmd: ConvoyCreate, ctx: DecideContext) -> Accepted[ConvoyResult]:
    beads = list(dict.fromkeys(cmd.beads))
    for bead_id in beads:
        get_bead(state, bead_id, field="beads")
    convoy_id = fresh_id(ctx, CONVOY_PREFIX, state.convoys, cmd.new_id)
    event = ConvoyCreated(convoy_id=convoy_id, title=cmd.title, beads=beads, owned=cmd.owned)
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=0)],
        result=_progress(state, convoy_id, beads, status="open", changed=True),
    )


def add(state: MayorState, cmd: ConvoyAdd) -> Accepted[ConvoyResult]:
    convoy = get_convoy(state, cmd.id)
    if convoy.status == "closed":
        raise CommandError(
            "backward_transition", f"convoy {convoy.id} is closed; it cannot track more beads (create a new convoy)"
        )
    new = [b for b in dict.fromkeys(cmd.beads) if b not in convoy.beads]
    for bead_id in new:
        get_bead(state, bead_id, field="beads")
    if not new:
        return Accepted(result=_progress(state, convoy.id, convoy.beads, status="open", changed=False))
    event = ConvoyBeadsAdded(convoy_id=convoy.id, beads=new)
    out = _progress(state, convoy.id, [*convoy.beads, *new], status="open", changed=True)
    return Accepted(events=[NewEvent(payload=event, expected_seq=convoy.version)], result=out)


def land(state: MayorState, cmd: ConvoyLand) -> Accepted[ConvoyResult]:
    convoy = get_convoy(state, cmd.id)
    if not convoy.owned:
        raise CommandError("invalid", f"convoy {convoy.id} is not owned: it closes by itself when its beads do")
    if convoy.status == "closed":
        return Accepted(result=_progress(state, convoy.id, convoy.beads, status="closed", changed=False))
    closed, total = convoy_progress(state, convoy)
    open_beads = [b for b in convoy.beads if (bead := state.beads.get(b)) is None or bead.status != "closed"]
    if open_beads and not cmd.force:
        listed = ", ".join(open_beads[:10]) + (" ..." if len(open_beads) > 10 else "")
        raise CommandError(
            "conflict", f"convoy {convoy.id} still tracks {len(open_beads)} open beads ({listed}); land with force"
        )
    event = ConvoyClosed(
        convoy_id=convoy.id, landed=True, forced=bool(open_beads), closed_beads=closed, total_beads=total
    )
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=convoy.version)],
        result=_progress(state, convoy.id, convoy.beads, status="closed", changed=True),
    )
