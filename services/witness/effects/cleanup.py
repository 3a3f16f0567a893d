"""After a session ended: its pane reaped (its agent's processes stopped, its password file gone), its worktree
released for the polecat's next bead unless it holds unsaved work or a later session carries it on, its published
bundles dropped once its bead is closed, and ``session.cleaned`` recorded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog

from services.witness.effects.toolkit import Toolkit
from services.witness.plan.actions import Clean, ReapPane
from services.witness.state import Session
from shared.host import git
from shared.model.decision import NewEvent
from shared.model.events import SessionCleaned

log = structlog.get_logger(__name__)


class Cleaner:
    def __init__(self, kit: Toolkit) -> None:
        self.kit = kit

    async def reap_pane(self, action: ReapPane) -> None:
        session = self.kit.session(action.session)
        if session is not None and session.status == "ended":
            await asyncio.to_thread(self.kit.reap, session)

    async def clean(self, action: Clean) -> None:
        session = self.kit.session(action.session)
        if session is None or session.status != "ended" or (session.cleaned and not action.again):
            return
        if action.again and (session.worktree_removed or session.cleanings != 1):
            return  # done meanwhile
        # Its pane's last lines, before the pane goes (a warrant recorded them already): what an agent said last.
        tail = "" if session.pane_tail or action.again else await asyncio.to_thread(self.kit.pane_tail, session)
        await asyncio.to_thread(self.kit.reap, session)
        removed, detail = False, action.detail
        if action.remove_worktree:
            try:
                async with self.kit.worktree_locks.hold(session.worktree), self.kit.repo_locks.hold(session.rig):
                    # Decided before it waited for the worktree: a session of the same polecat may have been started
                    # in it meanwhile (work the merge queue sent back), and it is that session's worktree now.
                    successor = self._worktree_user(session)
                    if successor is not None:
                        detail = f"worktree carried on by {successor.id}"
                    else:
                        detail = await asyncio.to_thread(self._remove_worktree, session, action.delete)
                        removed = True
            except git.WorktreeNotEmptyError as exc:
                detail = str(exc)
                log.warning("worktree_kept", session=session.id, reason=detail)
        bead = self.kit.host.state.beads.get(session.bead)
        if bead is not None and bead.status == "closed":
            # Its published bundles were taken by the refinery (or will never be): gone with the bead's work.
            await asyncio.to_thread(git.force_remove, self.kit.published_dir(session))
        current = self.kit.session(session.id) or session
        event = SessionCleaned(session_id=session.id, worktree_removed=removed, detail=detail, pane_tail=tail)
        await self.kit.append(NewEvent(payload=event, expected_seq=current.version))

    def _worktree_user(self, session: Session) -> Session | None:
        """Another session, not ended, that works in ``session``'s worktree."""
        for other in self.kit.host.state.sessions.values():
            if other.id != session.id and other.worktree == session.worktree and other.status != "ended":
                return other
        return None

    def _remove_worktree(self, session: Session, delete: bool) -> str:
        """Give up the session's worktree unless it holds unsaved work (``WorktreeNotEmptyError``): kept for the
        polecat's next bead (``git.release_worktree``), or with ``delete`` removed; what was done."""
        worktree, bare = Path(session.worktree), self.kit.bare_repo(session.rig)
        if not worktree.exists() and not bare.exists():
            return "no worktree was made"  # a start that failed before the rig's clone: nothing for git to do
        # Nothing waits for it, while the bead's merge usually runs right now: its git yields the cores to that.
        with git.in_background():
            if delete:
                git.remove_worktree(bare, worktree, self.kit.base_branch(session.rig))
                return "worktree removed"
            return git.release_worktree(bare, worktree, self.kit.base_branch(session.rig))
