"""Answers about work in flight: a bead's ``molecule``, ``convoy`` and ``convoys``. Pure."""

from __future__ import annotations

from services.mayor.queries.beads import find_bead
from services.mayor.queries.pages import take
from services.mayor.queries.views import Sees, convoy_view, molecule_view
from services.mayor.state import MayorState
from shared.core.errors import QueryError
from shared.model.convoys import ConvoyView
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
