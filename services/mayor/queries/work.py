"""Answers about work in flight: a bead's ``molecule``, the ``gates`` not opened yet, ``convoy`` and ``convoys``.
Pure."""

from __future__ import annotations

from services.mayor.queries.beads import find_bead
from services.mayor.queries.pages import take
from services.mayor.queries.views import Sees, convoy_view, molecule_view
from services.mayor.state import MayorState, current_step
from shared.core.errors import QueryError
from shared.model import gates as gates_model
from shared.model.convoys import ConvoyView
from shared.model.gates import GateView
from shared.model.molecules import MoleculeView
from shared.model.queries import mayor
from shared.model.queries.base import Page


def molecule(state: MayorState, query: mayor.Molecule, sees: Sees) -> MoleculeView:
    bead = find_bead(state, query.bead, sees)
    found = state.molecules.get(bead.id)
    if found is None and bead.collected_molecule is not None:
        raise QueryError(
            "not_found",
            f"bead {bead.id} is closed and its {bead.collected_molecule} molecule was garbage-collected "
            f"(`gt bead history {bead.id}` shows its steps from the log)",
        )
    if found is None:
        raise QueryError("not_found", f"bead {bead.id} has no molecule")
    return molecule_view(found, bead)


def gates(state: MayorState, query: mayor.Gates, sees: Sees) -> list[GateView]:
    out = []
    for bead_id, found in state.molecules.items():
        bead = state.beads.get(bead_id)
        if bead is None or bead.status == "closed" or not sees(bead):
            continue
        if (query.bead is not None and bead.id != query.bead) or (query.rig is not None and bead.rig != query.rig):
            continue
        current = current_step(found)
        for step in found.steps:
            if step.wait is None or not step.gate_closed() or step.status == "done":
                continue
            out.append(
                GateView(
                    bead=bead.id,
                    bead_title=bead.title,
                    rig=bead.rig,
                    step=step.id,
                    step_title=step.title,
                    gate=step.wait,
                    waiting=current is step,
                    waiting_since=step.waiting_since,
                    opens_at=gates_model.opens_at(step.wait, step.waiting_since),
                )
            )
    out.sort(key=lambda view: (not view.waiting, view.bead, view.step))
    return out


def convoy(state: MayorState, query: mayor.Convoy, sees: Sees) -> ConvoyView:
    found = state.convoys.get(query.id)
    if found is None:
        raise QueryError("not_found", f"no convoy {query.id!r}")
    return convoy_view(state, found, with_beads=True, sees=sees)


def convoys(state: MayorState, query: mayor.Convoys) -> Page:
    return take(
        state.convoys.values(),
        limit=query.limit,
        after=query.after,
        page_bytes=query.page_bytes,
        view=lambda c: convoy_view(state, c),
        keep=lambda c: query.include_closed or c.status == "open",
    )
