"""Beads that need a session: whether one is owed now (or an escalation instead: a stale hook, the respawn limit),
when after a crash loop (the respawn backoff), in which order and under which polecat name, within the rig's
``max_polecats``; and the re-sling a stale hook owes."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import datetime, timedelta

from services.witness.plan.actions import Action, Escalate, Resling, Spawn
from services.witness.plan.names import polecat_name
from services.witness.plan.observed import Observed
from services.witness.plan.policy import Policy
from services.witness.plan.scope import TMUX_PREFIX
from services.witness.plan.sessions import AGENT_UNAUTHORIZED
from services.witness.projection import deaths
from services.witness.state import Crew, Rig, Session, WitnessState, WorkBead, agent_for, crew_of_bead
from shared.model.events import DEATHS
from shared.model.events.beads import WORKING
from shared.model.events.sessions import ACTIVE_SESSION
from shared.model.rigs import home_name


def session_id_for(bead: str, attempt: int) -> str:
    """Deterministic, so two witnesses (or one restarted) can never create two sessions for one attempt."""
    suffix = f"-{attempt}"
    if len(bead) + len(suffix) <= 64:
        return f"{bead}{suffix}"
    digest = hashlib.blake2b(bead.encode()).hexdigest()[:8]
    return f"{bead[: 64 - len(suffix) - 9]}-{digest}{suffix}"


def tmux_name_for(rig: str, polecat: str) -> str:
    return f"{TMUX_PREFIX}{rig}-{polecat}"


def needs_session(
    state: WitnessState, bead: WorkBead, rig: Rig, acting_since: datetime | None = None
) -> tuple[bool, Escalate | None]:
    """Whether the bead should get a (fresh) session now; or the escalation owed instead of one.
    ``acting_since``: see ``Observed``."""
    if bead.status not in WORKING or bead.merge_requested or bead.resling_owed:
        return False, None
    if bead.waiting_gate() is not None:
        return False, None  # its current step waits on its gate: a session when it opens
    sessions = [state.sessions[s] for s in bead.sessions if s in state.sessions]
    if any(s.status in ACTIVE_SESSION for s in sessions):
        return False, None
    since_sling = sessions[bead.sessions_at_sling :]
    if not since_sling:
        return True, None
    last = since_sling[-1]
    if last.hook_recovery == "escalate" and last.escalated is None:
        return False, Escalate(session=last.id, reason="stale_hook", message=last.hook_recovery_detail)
    if last.end_reason == "done" and bead.returned:
        # The refinery sent the work back: a session once the mayor appended the rework steps it is to work.
        return not bead.rework_owed, None
    if last.end_reason == "stopped":
        stopped_here = acting_since is not None and last.ended_at is not None and last.ended_at >= acting_since
        return not stopped_here, None
    if last.escalated is not None or last.end_reason in ("done", "bead_closed"):
        return False, None
    if last.end_reason in DEATHS and deaths(state, bead) - bead.deaths_at_sling > rig.max_respawns:
        counted = deaths(state, bead) - bead.deaths_at_sling
        return False, Escalate(
            session=last.id,
            reason="respawn_limit",
            message=(
                f"bead {bead.id} ({bead.title}) died {counted} times on rig {rig.name}, last as "
                f"{last.end_reason}; the witness stopped respawning it (limit {rig.max_respawns}). "
                f"{last_words(last)}Look at its worktree {last.worktree}, then re-sling it with "
                f"`gt sling {bead.id} {rig.name} --force`."
            ),
        )
    return True, None


def last_words(session: Session) -> str:
    """What the session's pane showed when it was warranted, quoted for an escalation (the cause of a death is
    there: an agent's last error, its exit status), or what its end recorded when the pane was gone."""
    if session.pane_tail:
        return f"Its last session {session.id} showed:\n{session.pane_tail}\n"
    detail = session.end_detail or session.warrant_detail
    return f"Its last session {session.id} ended with: {detail}.\n" if detail else ""


def _lived_s(session: Session) -> float:
    began = session.started_at or session.requested_at
    return (session.ended_at - began).total_seconds() if session.ended_at is not None else 0.0


def respawn_due(state: WitnessState, bead: WorkBead, policy: Policy) -> datetime | None:
    """When the bead may have its next session, if its last one died quickly and not for the first time in a row:
    one crash is recovered at once, the second quick death in a row waits ``respawn_backoff_s``, each further one
    twice as long as the one before, at most ``respawn_backoff_max_s``. A death after a
    session that lived ``respawn_backoff_reset_s``, or got a step done, is no crash loop: counting stops there (and
    at the last operator sling). None: no wait. From the log's timestamps only, so a restarted witness waits the
    same."""
    if policy.respawn_backoff_s <= 0:
        return None
    since_sling = [state.sessions[s] for s in bead.sessions[bead.sessions_at_operator_sling :] if s in state.sessions]
    quick = 0
    for session in reversed(since_sling):
        if session.end_reason not in DEATHS or session.ended_at is None:
            break
        if session.steps_done or _lived_s(session) >= policy.respawn_backoff_reset_s:
            break
        quick += 1
    last_end = since_sling[-1].ended_at if since_sling else None
    if quick <= 1 or last_end is None:
        return None  # no crash loop (yet): a single crash costs nothing but the respawn
    wait = min(policy.respawn_backoff_max_s, policy.respawn_backoff_s * 2.0 ** min(quick - 2, 32))
    return last_end + timedelta(seconds=wait)


def held_names(state: WitnessState, obs: Observed) -> dict[tuple[str, str], str]:
    """(rig, polecat) -> the bead whose latest session holds that name. A name is free again once that
    session ended and its worktree was removed."""
    latest: dict[tuple[str, str], Session] = {}
    for session in state.sessions.values():  # in the order they were requested
        latest[(session.rig, session.polecat)] = session
    held = {
        key: session.bead
        for key, session in latest.items()
        if not (session.status == "ended" and session.cleaned and session.worktree_removed)
    }
    for key in obs.reserved:
        held.setdefault(key, "")
    return held


def beads_to_spawn(state: WitnessState, obs: Observed, policy: Policy) -> Iterator[Action]:
    waiting: list[WorkBead] = []
    for bead in state.beads.values():
        rig = state.rigs.get(bead.rig or "")
        if rig is None:
            continue
        if bead.resling_owed and bead.status in WORKING and bead.sessions:
            if not rig.removed:  # the mayor refuses slings to a removed rig: the bead waits for an operator
                yield Resling(bead=bead.id, rig=rig.name, after=bead.sessions[-1])
            continue
        needed, escalation = needs_session(state, bead, rig, obs.acting_since)
        if escalation is not None:
            yield escalation
        elif needed and not rig.parked:  # a parked rig's beads wait for `gt rig unpark`
            due = respawn_due(state, bead, policy)
            if due is None or obs.now >= due:
                waiting.append(bead)
    if not waiting:
        return
    # Work under way first (a bead that had a session: re-slung after a death, or sent back by the merge queue),
    # then in sling order. A re-sling is the bead's newest sling: by that alone it would wait behind every bead
    # never started, while its hook lapses and the deacon takes it for stale.
    waiting.sort(key=lambda b: (not b.sessions, b.slung_seq))
    held = held_names(state, obs)
    in_use: dict[str, int] = {}
    working_in: set[str] = set()
    for session in state.sessions.values():
        if session.status in ACTIVE_SESSION:
            in_use[session.rig] = in_use.get(session.rig, 0) + 1
            working_in.add(session.worktree)
    for rig_name, _polecat in obs.reserved:
        in_use[rig_name] = in_use.get(rig_name, 0) + 1
    for bead in waiting:
        if f"bead:{bead.id}" in obs.busy:
            continue
        rig = state.rigs[bead.rig or ""]
        crew = crew_of_bead(state, bead.id)
        if crew is not None:
            # A crew member's work runs as the member, in its workspace, not in one of the rig's polecat places;
            # after a session of an earlier bead there has ended.
            if crew.ready and crew.rig == rig.name and crew.workspace not in working_in:
                yield _crew_spawn(state, bead, rig, crew)
            continue
        if in_use.get(rig.name, 0) >= rig.max_polecats:
            continue  # queued: it gets a polecat when one of the rig's sessions ends
        spawn = _spawn_for(state, bead, rig, held, policy)
        held[(rig.name, spawn.polecat)] = bead.id
        in_use[rig.name] = in_use.get(rig.name, 0) + 1
        yield spawn


def _crew_spawn(state: WitnessState, bead: WorkBead, rig: Rig, crew: Crew) -> Spawn:
    """A session of a bead hooked to crew member ``crew``: the member is its polecat, its workspace and branch the
    session's (each session of the bead starts where the last left the workspace)."""
    last = state.sessions.get(bead.sessions[-1]) if bead.sessions else None
    return _spawn(bead, rig, last, crew.name, crew.workspace, crew.branch)


def _spawn_for(
    state: WitnessState, bead: WorkBead, rig: Rig, held: dict[tuple[str, str], str], policy: Policy
) -> Spawn:
    previous = [state.sessions[s] for s in bead.sessions if s in state.sessions]
    last = previous[-1] if previous else None
    if last is not None and held.get((rig.name, last.polecat)) in (bead.id, None):
        polecat = last.polecat  # the same polecat and worktree: uncommitted work carries over
    else:
        taken = {name for (r, name) in held if r == rig.name}
        polecat = next(polecat_name(i) for i in range(len(taken) + 1) if polecat_name(i) not in taken)
    branch = previous[0].branch if previous else f"polecat/{polecat}/{bead.id}"
    return _spawn(bead, rig, last, polecat, f"{policy.rigs_root}/{home_name(rig)}/polecats/{polecat}", branch)


def _spawn(bead: WorkBead, rig: Rig, last: Session | None, polecat: str, worktree: str, branch: str) -> Spawn:
    """The bead's next session, as ``polecat`` in ``worktree`` on ``branch``; ``last``: its session before."""
    attempt = len(bead.sessions) + 1
    return Spawn(
        bead=bead.id,
        session=session_id_for(bead.id, attempt),
        rig=rig.name,
        polecat=polecat,
        worktree=worktree,
        branch=branch,
        tmux_name=tmux_name_for(rig.name, polecat),
        attempt=attempt,
        agent=agent_for(bead, rig),
        handoff_of=last.id if last is not None and last.end_reason == "handoff" else None,
        resling=last is not None and (last.end_reason in DEATHS or last.end_reason == AGENT_UNAUTHORIZED),
    )
