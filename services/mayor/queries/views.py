"""How the mayor shows its records in query answers, and who may see which bead. Pure."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from services.mayor.state import (
    Bead,
    Convoy,
    MayorState,
    Molecule,
    convoy_progress,
    convoy_waves,
    current_step,
    is_complete,
    open_blockers,
)
from shared.model.convoys import ConvoyView, DispatchView
from shared.model.molecules import MoleculeView

Sees = Callable[[Bead], bool]
"""Whether the asker may see a bead: every bead, except mail, which a polecat session sees only when it is to or
from its own polecat (``services.mayor.queries.mail.mail_visible_to``)."""


def everything(_bead: Bead) -> bool:
    return True


def molecule_view(molecule: Molecule, bead: Bead) -> MoleculeView:
    """The molecule, where it stands, and its bead's status and rig."""
    step = current_step(molecule)
    return MoleculeView(
        **msgspec.structs.asdict(molecule),
        current_step=step.id if step else None,
        done=sum(1 for s in molecule.steps if s.status == "done"),
        total=len(molecule.steps),
        complete=is_complete(molecule),
        bead_status=bead.status,
        rig=bead.rig,
    )


def convoy_view(state: MayorState, convoy: Convoy, *, with_beads: bool = False, sees: Sees = everything) -> ConvoyView:
    """The convoy and its progress; ``with_beads``: each bead it tracks that the asker sees, and how many are held."""
    closed, total = convoy_progress(state, convoy)
    view = ConvoyView(**msgspec.structs.asdict(convoy), closed=closed, total=total)
    if with_beads:
        waves = convoy_waves(state, convoy)
        view.bead_details = [
            dispatch_view(state, b, waves[bead_id])
            for bead_id in convoy.beads
            if (b := state.beads.get(bead_id)) and sees(b)
        ]
        view.held = sum(1 for bead_id in convoy.beads if bead_id in state.holds)
    return view


def dispatch_view(state: MayorState, bead: Bead, wave: int) -> DispatchView:
    """A convoy's bead: where it is, its wave, and (while open) what it waits for and the rig it is held for."""
    hold = state.holds.get(bead.id)
    return DispatchView(
        id=bead.id,
        title=bead.title,
        status=bead.status,
        rig=bead.rig,
        wave=wave,
        waiting_for=open_blockers(state, bead) if bead.status == "open" else [],
        held_for=hold.rig if hold is not None else None,
    )
