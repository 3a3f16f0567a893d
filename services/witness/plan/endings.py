"""After a session ended: its hook released, its pane reaped, its worktree cleaned up (removed, or kept for a
successor, a re-sling or manual recovery; an agent still reading what `gt done` said is given its grace); rigs
whose sessions died together; tmux sessions nobody owns."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from services.witness.plan.actions import Action, Clean, KillOrphan, MassDeath, ReapPane, ReleaseHook
from services.witness.plan.observed import Observed, pane_of
from services.witness.plan.policy import Policy
from services.witness.plan.scope import TMUX_PREFIX
from services.witness.state import Session, WitnessState, crew_workspaces
from shared.core import subjects
from shared.core.ids import hook_lease_name
from shared.model.events import DEATHS
from shared.model.sessions import may_linger


def _successor(state: WitnessState, session: Session) -> Session | None:
    bead = state.beads.get(session.bead)
    if bead is None or session.id not in bead.sessions:
        return None
    later = bead.sessions[bead.sessions.index(session.id) + 1 :]
    for sid in later:
        other = state.sessions.get(sid)
        if other is not None and other.polecat == session.polecat:
            return other
    return None


def ended_sessions(state: WitnessState, obs: Observed, policy: Policy) -> Iterator[Action]:
    latest: dict[tuple[str, str], str] = {}  # filled once, when first needed
    crew_places = crew_workspaces(state)
    for session in state.sessions.values():
        if session.status != "ended":
            continue
        hook = state.hooks.get(hook_lease_name(session.bead)) if session.lease_token is not None else None
        if hook is not None and hook.holder == session.id and hook.status == "held":
            yield ReleaseHook(session=session.id, bead=session.bead)
            continue
        if session.worktree in crew_places:
            # A crew member's workspace outlives its sessions: it goes only with the member (``plan.crew``).
            reporting = session.end_reason == "done" and _reporting_done(session, obs, policy)
            if not session.cleaned and not reporting:
                yield Clean(session=session.id, remove_worktree=False, detail="kept: a crew member's workspace")
            continue
        if session.cleaned:
            if _kept_after_its_bead_closed(state, session, latest):
                yield Clean(session=session.id, remove_worktree=True, again=True)
            continue
        bead = state.beads.get(session.bead)
        successor = _successor(state, session)
        if successor is not None:
            yield Clean(session=session.id, remove_worktree=False, detail=f"worktree carried on by {successor.id}")
        elif session.end_reason == "done" or bead is None or bead.status == "closed":
            if not _reporting_done(session, obs, policy):
                yield Clean(session=session.id, remove_worktree=True)
        elif session.end_reason == "unslung":
            # Kept for the bead's next sling (same polecat, worktree and branch) unless the unsling asked
            # otherwise and the bead was not slung again since; the executor keeps it anyway if work is unsaved.
            remove = bead.unslung and bead.unsling_remove_worktree
            yield Clean(
                session=session.id, remove_worktree=remove, delete=remove, detail="" if remove else "kept: bead unslung"
            )
        elif _is_last_escalated(state, session):
            yield Clean(session=session.id, remove_worktree=False, detail="kept for manual recovery (escalated)")
        elif pane_of(session, obs) is not None and session.version <= obs.as_of_seq:
            yield ReapPane(session=session.id)


def _kept_after_its_bead_closed(state: WitnessState, session: Session, latest: dict[tuple[str, str], str]) -> bool:
    """Cleaned with its worktree kept (for manual recovery after an escalation, for the bead's next sling), and its
    bead closed since: the worktree is tried once more (never removed with unsaved work), so the polecat's name,
    which it holds while its worktree is there (``held_names``), is free for other beads. ``latest``: (rig,
    polecat) -> the session that last had the name (a worktree carried on by a later one is not this one's)."""
    if session.worktree_removed or session.cleanings != 1:
        return False
    bead = state.beads.get(session.bead)
    if bead is not None and bead.status != "closed":
        return False
    if not latest:
        latest.update({(s.rig, s.polecat): s.id for s in state.sessions.values()})  # in the order requested
    return latest.get((session.rig, session.polecat)) == session.id


def _reporting_done(session: Session, obs: Observed, policy: Policy) -> bool:
    """The session ended by `gt done` (run by its agent), and its agent still runs, within the grace: it is left
    alone, so `gt done` prints its result and exits, and the agent sees it, before the witness ends the session.
    (Ending the session kills its process tree, `gt done` and its caller with it.)"""
    if not may_linger(session) or session.ended_at is None:
        return False
    pane = pane_of(session, obs)
    if pane is None or pane.dead or not obs.alive.get(session.id, True):
        return False  # the agent exited (or is gone): nothing to wait for
    if session.id in obs.reported_done:
        return False  # its agent ended the turn that ran `gt done`: it has read the result
    return (obs.now - session.ended_at).total_seconds() < policy.done_exit_grace_s


def _is_last_escalated(state: WitnessState, session: Session) -> bool:
    bead = state.beads.get(session.bead)
    return session.escalated is not None and bead is not None and bead.sessions[-1:] == [session.id]


def mass_deaths(state: WitnessState, obs: Observed, policy: Policy) -> Iterator[Action]:
    """Sessions of ``mass_death_count`` different beads of one rig that died within the window: something they share
    may be broken. One bead dying again and again is that bead's trouble (its respawn backoff and limit)."""
    by_rig: dict[str, list[Session]] = {}
    for session in state.sessions.values():
        covered = state.mass_deaths.get(session.rig, ())
        if session.end_reason in DEATHS and session.ended_at is not None and session.id not in covered:
            by_rig.setdefault(session.rig, []).append(session)
    window = timedelta(seconds=policy.mass_death_window_s)
    for rig, died in by_rig.items():
        died.sort(key=lambda s: s.ended_at or obs.now)
        for i, first in enumerate(died):
            assert first.ended_at is not None
            cluster = [s for s in died[i:] if s.ended_at is not None and s.ended_at - first.ended_at <= window]
            if len({s.bead for s in cluster}) >= policy.mass_death_count:
                yield MassDeath(rig=rig, sessions=tuple(s.id for s in cluster), window_s=policy.mass_death_window_s)
                break


def orphans(state: WitnessState, obs: Observed, policy: Policy) -> Iterator[Action]:
    if obs.panes is None:
        return
    now = obs.now.timestamp()
    for pane in obs.panes.values():
        if not pane.name.startswith(TMUX_PREFIX) or pane.label in state.sessions:
            continue
        if (name := subjects.town_agent_of_user(pane.label)) is not None and name in state.town_agents:
            continue  # a town agent's: ended by its own plan (``town_agents``) when it is stopped
        if now - pane.created >= policy.min_orphan_age_s:
            yield KillOrphan(tmux_name=pane.name, pane_pid=pane.pane_pid, created=pane.created)
