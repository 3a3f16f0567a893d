"""After a session ended: its pane reaped (its agent's processes stopped, its password file gone), its worktree
released for the polecat's next bead unless it holds unsaved work or a later session carries it on, its published
bundles dropped once its bead is closed, and ``session.cleaned`` recorded; then the rig's clone fetched and the
released workspace settled, so the next start waits for neither."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import structlog

from services.witness.effects import clone_fetch, workspace_records
from services.witness.effects.toolkit import Toolkit
from services.witness.plan.actions import Clean, ReapPane
from services.witness.state import Session
from shared.host import git, tree_moves
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
        said = "" if action.again else await asyncio.to_thread(self.kit.transcript_tail, session)
        await asyncio.to_thread(self.kit.reap, session)
        removed, detail, released = False, action.detail, None
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
                        released = await asyncio.to_thread(
                            tree_moves.index_stamp, Path(session.worktree, ".git", "index")
                        )
            except git.WorktreeNotEmptyError as exc:
                detail = str(exc)
                log.warning("worktree_kept", session=session.id, reason=detail)
        bead = self.kit.host.state.beads.get(session.bead)
        if bead is not None and bead.status == "closed":
            # Its published bundles were taken by the refinery (or will never be): gone with the bead's work.
            await asyncio.to_thread(git.force_remove, self.kit.published_dir(session))
        current = self.kit.session(session.id) or session
        event = SessionCleaned(
            session_id=session.id, worktree_removed=removed, detail=detail, pane_tail=tail, transcript_tail=said
        )
        await self.kit.append(NewEvent(payload=event, expected_seq=current.version))
        if released is not None and not action.delete:
            await self._fetch_clone(session.rig)
            if workspace_records.may_settle(self.kit):
                await self._settle(session, released)

    async def _settle(self, session: Session, released: tree_moves.IndexStamp) -> None:
        """Make the released workspace ready for the polecat's next bead now, rather than when that bead starts
        (``git.settle_released``): its name is free already, and a start that comes meanwhile waits for the
        worktree's lock, then moves it by the change. Skipped when a later session has it already (that start took
        the whole way; ``released``, the index as the release left it, tells even one of another witness), or a
        process of an earlier session still runs (what it writes later would be in no index: the start stops it
        and takes the whole way); a failure only leaves the whole way to the next start."""
        async with self.kit.worktree_locks.hold(session.worktree), workspace_records.held(self.kit, session):
            if self._worktree_user(session) is not None or self._later_session(session):
                return
            index = Path(session.worktree, ".git", "index")
            if await asyncio.to_thread(tree_moves.index_stamp, index) != released:
                return
            if await asyncio.to_thread(self.kit.leftovers_of, session.worktree, self.kit.ended_in(session.worktree)):
                log.info("workspace_settle_skipped", session=session.id, reason="processes of its session still run")
                return
            await asyncio.to_thread(workspace_records.forget_settled, self.kit, session)
            try:
                settled = await asyncio.to_thread(self._settled, session)
            except (git.GitError, OSError) as exc:
                log.warning("workspace_settle_failed", session=session.id, error=str(exc)[:500])
                return
            if settled is not None:
                await asyncio.to_thread(workspace_records.keep_settled, self.kit, session, settled)

    async def _fetch_clone(self, rig: str) -> None:
        """After a release, the rig's clone fetched unless it was a moment ago (``clone_fetch``): the workspace is
        settled at the newest base, and the polecat's next start (any start of the rig meanwhile) waits for no fetch.
        A failure is only logged: the next start fetches."""
        fetches = self.kit.clone_fetches
        async with self.kit.repo_locks.hold(rig):
            merged = self.kit.host.state.base_merged.get(rig, 0)
            if fetches.fresh(rig, merged, time.monotonic(), clone_fetch.RELEASE_REFETCH_S):
                return
            try:
                with git.in_background():  # as the release: the bead's merge may run right now
                    await asyncio.to_thread(fetches.fetch, rig, self.kit.bare_repo(rig), merged)
            except git.GitError as exc:
                log.warning("clone_fetch_failed", rig=rig, error=str(exc)[:500])

    def _settled(self, session: Session) -> git.SettledWorkspace | None:
        recycle = workspace_records.recycle_of(self.kit, session)
        if recycle.trusted_index is None:
            return None  # no index of the witness's: the next start makes the workspace again
        rig = self.kit.host.state.rigs.get(session.rig)
        origin = rig.repo if rig is not None else None
        with git.in_background():  # as the release: the bead's merge may run right now
            settled = git.settle_released(
                self.kit.bare_repo(session.rig), Path(session.worktree), self.kit.base_branch(session.rig),
                origin=origin, excludes=git.BUILD_OUTPUT, recycle=recycle,
            )  # fmt: skip
            workspace_records.keep_trusted_index(self.kit, session)
        return settled

    def _later_session(self, session: Session) -> bool:
        """Whether a session was requested for the worktree after ``session`` (it may have ended already)."""
        later = False
        for other in self.kit.host.state.sessions.values():  # in the order requested
            if other.id == session.id:
                later = True
                continue
            if later and other.worktree == session.worktree:
                return True
        return False

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
