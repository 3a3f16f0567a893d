"""What a rig's crew members are owed (docs/crew.md): their workspaces made when added and removed when they are.
Their sessions are planned with every bead's (``spawns``: a bead hooked to a member runs in its workspace). Pure."""

from __future__ import annotations

from collections.abc import Iterator

from services.witness.plan.actions import Action, MakeCrewWorkspace, RemoveCrewWorkspace
from services.witness.state import WitnessState
from shared.model.events.sessions import ACTIVE_SESSION


def owed(state: WitnessState) -> Iterator[Action]:
    busy: set[str] | None = None  # the workspaces sessions work in, looked up once when first needed
    for key, crew in state.crews.items():
        if crew.status == "added" and not crew.ready:
            rig = state.rigs.get(crew.rig)
            if rig is not None and not rig.removed:
                yield MakeCrewWorkspace(crew=key, rig=crew.rig)
        elif crew.status == "removed" and not crew.kept and not crew.gone:
            if busy is None:
                busy = {s.worktree for s in state.sessions.values() if s.status in ACTIVE_SESSION}
            if crew.workspace not in busy:
                yield RemoveCrewWorkspace(crew=key, rig=crew.rig)
