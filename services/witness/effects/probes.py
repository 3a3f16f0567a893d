"""What the witness looks up before it decides a command (decisions do no I/O): the facts ``decide`` reads from
its context (``decide.RepoFacts``, ``decide.WorktreeFacts``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.witness import decide as witness_decide
from services.witness.state import WitnessState
from shared.host import git
from shared.model.commands import Command, CrewAdd, CrewRemove, RigAdd, SessionRecoverHook
from shared.model.crew import crew_key
from shared.model.rigs import home_name


async def facts_for(state: WitnessState, cmd: Command, rigs_root: str) -> object:
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
            base = state_base(state, last.rig)
            return witness_decide.WorktreeFacts(await asyncio.to_thread(work_at_risk, last.worktree, last.branch, base))
        case CrewAdd():
            rig = state.rigs.get(cmd.rig)
            return witness_decide.CrewFacts(f"{rigs_root}/{home_name(rig) if rig else cmd.rig}/crew/{cmd.name}")
        case CrewRemove():
            crew = state.crews.get(crew_key(cmd.rig, cmd.name))
            if crew is None or crew.status != "added":
                return None
            at_risk = await asyncio.to_thread(work_at_risk, crew.workspace, None, state_base(state, crew.rig))
            return witness_decide.CrewFacts(crew.workspace, at_risk)
        case _:
            return None


def state_base(state: WitnessState, rig: str) -> str:
    record = state.rigs.get(rig)
    return record.base_branch if record else "main"


def work_at_risk(worktree: str, branch: str | None, base: str) -> str | None:
    """What a re-sling could lose in the session's worktree (None: nothing, or the worktree is another's now);
    ``branch`` None: whatever branch it is on (a crew member's, removed)."""
    try:
        state = git.worktree_state(Path(worktree), base)
    except git.GitError as exc:
        return f"a worktree git cannot read ({exc})"
    if not state.exists or branch not in (None, state.branch):
        return None
    parts = []
    if state.dirty:
        parts.append("uncommitted changes")
    if state.unpushed:
        parts.append(f"{state.unpushed} unpushed commit{'s' if state.unpushed != 1 else ''}")
    return " and ".join(parts) or None
