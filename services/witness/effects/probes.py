"""What the witness looks up before it decides a command (decisions do no I/O): the facts ``decide`` reads from
its context (``decide.RepoFacts``, ``decide.WorktreeFacts``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.witness import decide as witness_decide
from services.witness.state import WitnessState
from shared.host import git
from shared.model.commands import Command, RigAdd, SessionRecoverHook


async def facts_for(state: WitnessState, cmd: Command) -> object:
    """``rig.add`` of a rig not known yet: can git read the repository, has it the base branch? A stale hook's
    recovery: what a re-sling could lose in the worktree of the bead's last session. Anything else: nothing."""
    match cmd:
        case RigAdd() if cmd.name not in state.rigs:
            problem = await asyncio.to_thread(git.probe_repository, cmd.repo, cmd.base_branch)
            return witness_decide.RepoFacts(problem)
        case SessionRecoverHook():
            last = witness_decide.last_session_of(state, cmd.bead)
            if last is None or last.worktree_removed:
                return witness_decide.WorktreeFacts(None)
            rig = state.rigs.get(last.rig)
            base = rig.base_branch if rig else "main"
            return witness_decide.WorktreeFacts(await asyncio.to_thread(work_at_risk, last.worktree, last.branch, base))
        case _:
            return None


def work_at_risk(worktree: str, branch: str, base: str) -> str | None:
    """What a re-sling could lose in the session's worktree (None: nothing, or the worktree is another's now)."""
    try:
        state = git.worktree_state(Path(worktree), base)
    except git.GitError as exc:
        return f"a worktree git cannot read ({exc})"
    if not state.exists or state.branch != branch:
        return None
    parts = []
    if state.dirty:
        parts.append("uncommitted changes")
    if state.unpushed:
        parts.append(f"{state.unpushed} unpushed commit{'s' if state.unpushed != 1 else ''}")
    return " and ".join(parts) or None
