"""Pure reads of the mayor's state, shared by decisions, reconcile and queries."""

from __future__ import annotations

from services.mayor.state import INFRA_TYPES, MESSAGE_TYPE, READ_LABEL, Bead, Convoy, MayorState, Molecule, Step


def open_blockers(state: MayorState, bead: Bead) -> list[str]:
    """The beads ``bead`` needs that are not closed, however they closed (a blocker that does not exist
    blocks). The one rule for both `gt ready` and dispatch: a bead is worked only once this is empty."""
    return [need for need in bead.needs if (blocker := state.beads.get(need)) is None or blocker.status != "closed"]


def is_ready(state: MayorState, bead: Bead) -> bool:
    """Open, real work, and every blocker closed."""
    return bead.status == "open" and bead.type not in INFRA_TYPES and not open_blockers(state, bead)


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


def convoy_waves(state: MayorState, convoy: Convoy) -> dict[str, int]:
    """Bead id -> its wave in the convoy: 1 for a bead that needs no bead the convoy tracks, else one more than
    the latest wave among those it needs. A blocker outside the convoy holds a bead back but makes no wave."""
    tracked = set(convoy.beads)
    waves: dict[str, int] = {}
    visiting: set[str] = set()  # on the way down: guards against a cycle (refused by update, never trusted)
    for start in convoy.beads:
        stack = [start]
        while stack:  # depth-first without recursion: a chain may be as long as the convoy
            current = stack[-1]
            if current in waves:
                stack.pop()
                continue
            visiting.add(current)
            bead = state.beads.get(current)
            needs = [need for need in bead.needs if need in tracked] if bead is not None else []
            pending = [need for need in needs if need not in waves and need not in visiting]
            if pending:
                stack.extend(pending)
                continue
            waves[current] = 1 + max((waves.get(need, 0) for need in needs), default=0)
            visiting.discard(current)
            stack.pop()
    return waves


def is_message(bead: Bead) -> bool:
    return bead.type == MESSAGE_TYPE


def is_read(bead: Bead) -> bool:
    return READ_LABEL in bead.labels
