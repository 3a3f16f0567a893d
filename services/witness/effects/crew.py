"""A rig's crew members' workspaces (docs/crew.md): made when a member is added, removed when it is, each a
repository of its own on ``crew/<name>``, made as a polecat's is (``git.ensure_worktree``), but never recycled or
removed when a session in it ends."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import structlog

from services.witness.effects import clone_fetch
from services.witness.effects.toolkit import Toolkit
from services.witness.plan.actions import MakeCrewWorkspace, RemoveCrewWorkspace
from shared.host import git
from shared.model.crew import Crew
from shared.model.decision import NewEvent
from shared.model.events import CrewReady, CrewWorkspaceRemoved

log = structlog.get_logger(__name__)


class CrewWorkspaces:
    def __init__(self, kit: Toolkit) -> None:
        self.kit = kit

    def _crew(self, key: str) -> Crew | None:
        return self.kit.host.state.crews.get(key)

    async def make(self, action: MakeCrewWorkspace) -> None:
        crew = self._crew(action.crew)
        rig = self.kit.host.state.rigs.get(action.rig)
        if crew is None or crew.ready or crew.status != "added" or rig is None:
            return
        bare, path = self.kit.bare_repo(rig.name), Path(crew.workspace)
        async with self.kit.worktree_locks.hold(crew.workspace), self.kit.repo_locks.hold(rig.name):
            fetches, merged = self.kit.clone_fetches, self.kit.host.state.base_merged.get(rig.name, 0)
            began = time.monotonic()
            if await asyncio.to_thread(git.ensure_bare_clone, rig.repo, bare):
                fetches.record(rig.name, clone_fetch.Fetched(began=began, merged=merged))
            elif not fetches.fresh(rig.name, merged, began):
                await asyncio.to_thread(fetches.fetch, rig.name, bare, merged)  # it starts from the newest base
            await asyncio.to_thread(
                git.ensure_worktree,
                bare,
                path,
                crew.branch,
                rig.base_branch,
                origin=rig.repo,
                excludes=git.BUILD_OUTPUT,
            )
        if await self.kit.append(NewEvent(payload=CrewReady(rig=crew.rig, name=crew.name), expected_seq=crew.version)):
            log.info("crew_workspace_made", rig=crew.rig, crew=crew.name, workspace=crew.workspace)

    async def remove(self, action: RemoveCrewWorkspace) -> None:
        crew = self._crew(action.crew)
        if crew is None or crew.status != "removed" or crew.kept or crew.gone:
            return
        bare, path = self.kit.bare_repo(crew.rig), Path(crew.workspace)
        async with self.kit.worktree_locks.hold(crew.workspace), self.kit.repo_locks.hold(crew.rig):
            try:
                # Looked at again: work may have been done in it since its removal was decided.
                await asyncio.to_thread(git.remove_worktree, bare, path, self.kit.base_branch(crew.rig))
                removed, detail = True, "removed"
            except git.WorktreeNotEmptyError as exc:
                removed, detail = False, f"kept: {exc}"
        event = CrewWorkspaceRemoved(rig=crew.rig, name=crew.name, removed=removed, detail=detail[:500])
        if await self.kit.append(NewEvent(payload=event, expected_seq=crew.version)):
            log.info("crew_workspace_removed", rig=crew.rig, crew=crew.name, removed=removed, detail=detail)
