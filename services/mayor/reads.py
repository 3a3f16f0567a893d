"""Pure reads of the mayor's state, shared by decisions, reconcile and queries."""

from __future__ import annotations

from services.mayor.state import INFRA_TYPES, MESSAGE_TYPE, READ_LABEL, Bead, Convoy, MayorState, Molecule, Step


def is_ready(state: MayorState, bead: Bead) -> bool:
    """Open, real work, and every blocker closed (a blocker that does not exist blocks)."""
    if bead.status != "open" or bead.type in INFRA_TYPES:
        return False
    for need in bead.needs:
        blocker = state.beads.get(need)
        if blocker is None or blocker.status != "closed":
            return False
    return True


def depends_on(state: MayorState, start: str, target: str) -> bool:
    """True when ``start`` transitively needs ``target``."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        current = stack.pop()
        if current == target:
            return True
        if current in seen:
            continue
        seen.add(current)
        bead = state.beads.get(current)
        if bead is not None:
            stack.extend(bead.needs)
    return False


def is_ancestor(state: MayorState, candidate: str, bead_id: str) -> bool:
    """True when ``candidate`` is ``bead_id`` or one of its parents, grandparents, ..."""
    seen: set[str] = set()
    current: str | None = bead_id
    while current is not None and current not in seen:
        if current == candidate:
            return True
        seen.add(current)
        bead = state.beads.get(current)
        current = bead.parent if bead is not None else None
    return False


def dependents(state: MayorState, bead_id: str) -> list[str]:
    """Beads that need ``bead_id``, in creation order."""
    return [b.id for b in state.beads.values() if bead_id in b.needs]


def current_step(molecule: Molecule) -> Step | None:
    """The first step not done whose needs are all done (None when every step is done)."""
    done = {s.id for s in molecule.steps if s.status == "done"}
    for step in molecule.steps:
        if step.status != "done" and all(need in done for need in step.needs):
            return step
    return None


def unmet_needs(molecule: Molecule, step: Step) -> list[str]:
    done = {s.id for s in molecule.steps if s.status == "done"}
    return [need for need in step.needs if need not in done]


def is_complete(molecule: Molecule) -> bool:
    return all(step.status == "done" for step in molecule.steps)


def convoy_progress(state: MayorState, convoy: Convoy) -> tuple[int, int]:
    """(closed, total) beads; a bead that no longer exists counts as open."""
    closed = sum(1 for b in convoy.beads if (bead := state.beads.get(b)) is not None and bead.status == "closed")
    return closed, len(convoy.beads)


def is_message(bead: Bead) -> bool:
    return bead.type == MESSAGE_TYPE


def is_read(bead: Bead) -> bool:
    return READ_LABEL in bead.labels
