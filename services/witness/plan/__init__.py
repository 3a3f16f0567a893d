"""What the witness owes, computed from its projection and what it observed (tmux, processes, heartbeats).

Pure and level-triggered: the same state and observation give the same actions, whoever crashed when. The
executor (``executor.py``) carries them out; after each, the next plan sees the new state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import msgspec

from services.witness.plan.actions import (
    Action,
    Clean,
    ContinueSession,
    DeliverNudge,
    Escalate,
    ExpireNudge,
    GiveUp,
    Kill,
    KillOrphan,
    MassDeath,
    NudgeMail,
    ReapPane,
    ReleaseHook,
    Resling,
    Spawn,
    Start,
    Warrant,
)
from services.witness.plan.names import polecat_name
from services.witness.plan.scope import TMUX_PREFIX, in_scope
from services.witness.projection import deaths
from services.witness.state import Rig, Session, WitnessState, WorkBead, continue_nudge_id
from shared.events import DEATHS
from shared.events.beads import WORKING
from shared.events.sessions import ACTIVE_SESSION
from shared.ids import hook_lease_name
from shared.rig_state import home_name
from shared.runtimes import Restart, confirms_start, pane_activity_counts, runtime_for


class PaneSeen(msgspec.Struct, frozen=True, kw_only=True):
    """One tmux session on the witness's tmux server, as observed."""

    name: str
    pane_pid: int
    dead: bool
    created: int
    """Seconds since the epoch."""
    label: str = ""
    """The session id it was started for (empty: not started by a witness)."""
    activity: int = 0
    """tmux's last output or input in the session (seconds since the epoch; 0: unknown)."""


class Observed(msgspec.Struct, frozen=True, kw_only=True):
    now: datetime
    as_of_seq: int
    """The projection's sequence when observing began: sessions that changed later are judged next time."""
    panes: dict[str, PaneSeen] | None
    """By tmux session name; None when tmux could not be asked (then nothing is judged dead)."""
    alive: dict[str, bool] = {}
    """Session id -> its recorded pane process (pid and start time) still runs."""
    heartbeats: dict[str, datetime] = {}
    activity: dict[str, datetime] = {}
    """Session id -> its agent runtime's last activity seen in files (a tool-call hook's mark, its transcript) or
    on its screen (a retry status that changed since the last look: ``Runtime.activity_on_screen``)."""
    start_confirmed: frozenset[str] = frozenset()
    """Started sessions whose agent runtime confirmed its start (Claude Code's SessionStart hook ran)."""
    refused: dict[str, str] = {}
    """Started sessions whose agent recorded that the model API refused its credentials: why."""
    blocked: dict[str, str] = {}
    """Started sessions not confirmed yet whose pane shows a screen waiting for input (``Runtime.blocking_screen``):
    what it is."""
    idle: frozenset[str] = frozenset()
    """Started sessions whose runtime says they wait for input (``Runtime.idle``)."""
    restarts: dict[str, Restart] = {}
    """Idle sessions whose agent's newest start was a restart with a fresh context (``Runtime.restart``)."""
    reported_done: frozenset[str] = frozenset()
    """Sessions ended by `gt done` whose agent ended a turn since (``runtimes.turn_ended_after_done``): it has read
    what `gt done` said, so the grace (``done_exit_grace_s``) is not waited out."""
    start_failures: dict[str, int] = {}
    busy: frozenset[str] = frozenset()
    """Keys of actions still running."""
    reserved: frozenset[tuple[str, str]] = frozenset()
    """(rig, polecat) names taken by spawns still running."""
    acting_since: datetime | None = None
    """When this witness process began acting: a session the operator stopped since then is not respawned by
    it (the town is going down); the next witness respawns it."""


class Policy(msgspec.Struct, frozen=True, kw_only=True):
    rigs_root: str
    """Directory holding one directory per rig (GT_HOME/rigs)."""
    min_orphan_age_s: float = 60.0
    done_stuck_after_s: float = 60.0
    done_exit_grace_s: float = 60.0
    """An agent still running after `gt done` ended its session is left this long to see the result."""
    mass_death_count: int = 3
    mass_death_window_s: float = 30.0
    respawn_backoff_s: float = 5.0
    respawn_backoff_max_s: float = 300.0
    respawn_backoff_reset_s: float = 300.0
    """See ``WitnessSettings`` (``GT_RESPAWN_BACKOFF*``) and ``respawn_due``."""
    max_start_failures: int = 3
    start_confirm_s: float = 120.0
    """A runtime that confirms its start (a hook) and did not within this long after its pane started has failed
    to start (``GT_AGENT_START_TIMEOUT``)."""
    rigs: frozenset[str] | None = None
    """The witness's scope (``GT_WITNESS_RIGS``): it acts only for these rigs; None: for all."""


AGENT_UNAUTHORIZED = "agent_unauthorized"
"""The warrant (and end reason) of a session whose agent's credentials were refused: its rig is parked and the
operator told, as every new session would be refused too."""


def session_id_for(bead: str, attempt: int) -> str:
    """Deterministic, so two witnesses (or one restarted) can never create two sessions for one attempt."""
    suffix = f"-{attempt}"
    if len(bead) + len(suffix) <= 64:
        return f"{bead}{suffix}"
    digest = hashlib.blake2b(bead.encode()).hexdigest()[:8]
    return f"{bead[: 64 - len(suffix) - 9]}-{digest}{suffix}"


def tmux_name_for(rig: str, polecat: str) -> str:
    return f"{TMUX_PREFIX}{rig}-{polecat}"


def plan(state: WitnessState, obs: Observed, policy: Policy) -> list[Action]:
    """Every action owed now for the witness's rigs, most urgent first, leaving out those whose key is busy."""
    out: list[Action] = []
    out.extend(_active_sessions(state, obs, policy))
    out.extend(_spawns(state, obs, policy))
    out.extend(_ended_sessions(state, obs, policy))
    out.extend(_mass_deaths(state, obs, policy))
    out.extend(_orphans(state, obs, policy))
    out.extend(_nudges(state, obs))
    out.extend(_continuations(state, obs))
    out.extend(_mail(state, obs))
    seen: set[str] = set(obs.busy)
    owed: list[Action] = []
    for action in out:
        if action.key not in seen:
            seen.add(action.key)
            owed.append(action)
    owed.sort(key=lambda a: a.PRIORITY)
    return in_scope(state, owed, policy.rigs)


def pane_of(session: Session, obs: Observed) -> PaneSeen | None:
    """The tmux session running ``session``, if it is there (a same-named one for another session is not)."""
    if obs.panes is None:
        return None
    pane = obs.panes.get(session.tmux_name)
    return pane if pane is not None and pane.label == session.id else None


# ---- sessions that hold a hook -----------------------------------------------------------------


def _active_sessions(state: WitnessState, obs: Observed, policy: Policy) -> Iterator[Action]:
    for session in state.sessions.values():
        if session.status not in ACTIVE_SESSION:
            continue
        if session.warrant_reason is not None:
            yield Kill(session=session.id)
            continue
        bead = state.beads.get(session.bead)
        if bead is None or (bead.status == "closed" and session.done_intent_at is None):
            # A session in `gt done` is left to finish: the refinery may merge and close its bead first.
            yield Warrant(session=session.id, reason="bead_closed", detail="its bead was closed")
            continue
        if bead.unslung and session.done_intent_at is None:
            # The operator took the hook back: the session ends cleanly (no death, no respawn); one still being
            # started is ended once its spawn is through, so no tmux session comes up after it ended.
            if session.status != "requested" or f"bead:{session.bead}" not in obs.busy:
                yield Warrant(session=session.id, reason="unslung", detail="its bead was unslung")
            continue
        if session.status == "requested":
            if f"bead:{session.bead}" in obs.busy:
                continue  # its spawn is still starting it
            failures = obs.start_failures.get(session.id, 0)
            if failures >= policy.max_start_failures:
                yield GiveUp(session=session.id, detail=f"did not start after {failures} tries")
            else:
                yield Start(session=session.id)
            continue
        lost = _lost_hook(state, session)
        if lost is not None:
            yield Warrant(session=session.id, reason="stalled", detail=lost)
            continue
        if session.version > obs.as_of_seq or obs.panes is None:
            continue  # changed while we looked, or tmux unknown: judge it on the next observation
        warrant = _judge(session, bead, state.rigs.get(session.rig), obs, policy)
        if warrant is not None:
            yield warrant


def _lost_hook(state: WitnessState, session: Session) -> str | None:
    """Why a started session no longer holds its bead's hook lease (None: it holds it, or never had one).
    Its agent is fenced out (its commands are refused), so it is warranted like a stalled one."""
    if session.lease_token is None or session.done_intent_at is not None:
        return None
    hook = state.hooks.get(hook_lease_name(session.bead))
    if hook is None or (hook.token == session.lease_token and hook.status == "held"):
        return None
    if hook.token == session.lease_token and hook.status == "expired":
        return f"its hook lease {hook.name} expired: not renewed for {hook.ttl_s:g}s"
    return f"it lost its hook lease {hook.name} (token {session.lease_token}; now {hook.token}, {hook.status})"


def _judge(session: Session, bead: WorkBead, rig: Rig | None, obs: Observed, policy: Policy) -> Warrant | None:
    pane = pane_of(session, obs)
    if pane is None:
        return Warrant(session=session.id, reason="dead", detail=f"tmux session {session.tmux_name} is gone")
    if pane.dead or not obs.alive.get(session.id, True):
        return Warrant(
            session=session.id,
            reason="zombie",
            detail=f"tmux session {session.tmux_name} is there but its agent (pid {session.pane_pid}) is not",
        )
    refused = obs.refused.get(session.id)
    if refused is not None and rig is not None:
        return Warrant(session=session.id, reason=AGENT_UNAUTHORIZED, detail=f"rig {rig.name}: {refused}")
    blocked = obs.blocked.get(session.id)
    if blocked is not None and rig is not None and session.id not in obs.start_confirmed:
        # Nobody answers it, and a fresh session would meet it again: escalated now, not after the start deadline
        # and every respawn.
        return Warrant(
            session=session.id,
            reason="failed_to_start",
            detail=(
                f"rig {rig.name}: session {session.id} (bead {session.bead}, polecat {session.polecat}, "
                f"{rig.agent_command} in tmux session {session.tmux_name}) showed no SessionStart hook: its pane "
                f"waits at {blocked}"
            ),
            escalate=True,
        )
    unconfirmed = _unconfirmed_start(session, rig, obs, policy)
    if unconfirmed is not None:
        return unconfirmed
    if session.done_intent_at is not None:
        waited = (obs.now - session.done_intent_at).total_seconds()
        if waited > policy.done_stuck_after_s:
            return Warrant(session=session.id, reason="stuck_in_done", detail=f"done-intent {waited:.0f}s ago")
        return None
    if rig is not None and (session.id in obs.start_confirmed or not confirms_start(rig.agent_command)):
        # A runtime that confirms its start is judged by the start deadline until it has: its boot is no stall.
        last = last_sign_of_life(session, bead, obs, pane_counts=pane_activity_counts(rig.agent_command))
        quiet = (obs.now - last).total_seconds()
        if quiet > rig.stall_after_s:
            return Warrant(
                session=session.id,
                reason="stalled",
                detail=(
                    f"no heartbeat, step progress or agent activity for {quiet:.0f}s (limit {rig.stall_after_s:g}s)"
                ),
            )
    return None


def _unconfirmed_start(session: Session, rig: Rig | None, obs: Observed, policy: Policy) -> Warrant | None:
    """A session whose runtime confirms its start (a hook) and has not, past the deadline: its pane is up but the
    agent never got going (a dialog nobody answers, a crash before its first turn, a broken install)."""
    if rig is None or session.started_at is None or session.done_intent_at is not None:
        return None
    if session.id in obs.start_confirmed or not confirms_start(rig.agent_command):
        return None
    waited = (obs.now - session.started_at).total_seconds()
    if waited <= policy.start_confirm_s:
        return None
    return Warrant(
        session=session.id,
        reason="failed_to_start",
        detail=(
            f"rig {rig.name}: session {session.id} ({rig.agent_command} in tmux session {session.tmux_name}) showed "
            f"no SessionStart hook {waited:.0f}s after its pane started (limit {policy.start_confirm_s:g}s)"
        ),
    )


def last_sign_of_life(session: Session, bead: WorkBead, obs: Observed, *, pane_counts: bool = False) -> datetime:
    """The newest of: the session's start, its step progress, its agent's `gt heartbeat`, its runtime's activity
    (hooks, transcript) and, for runtimes that show nothing else (``pane_counts``), output in its tmux pane."""
    moments = [
        m
        for m in (
            session.started_at,
            session.requested_at,
            obs.heartbeats.get(session.id),
            obs.activity.get(session.id),
            bead.last_progress_at,
        )
        if m
    ]
    pane = pane_of(session, obs) if pane_counts else None
    if pane is not None and pane.activity > 0:
        moments.append(datetime.fromtimestamp(pane.activity, UTC))
    return max(moments)


# ---- beads that need a session -----------------------------------------------------------------


def needs_session(
    state: WitnessState, bead: WorkBead, rig: Rig, acting_since: datetime | None = None
) -> tuple[bool, Escalate | None]:
    """Whether the bead should get a (fresh) session now; or the escalation owed instead of one.
    ``acting_since``: see ``Observed``."""
    if bead.status not in WORKING or bead.merge_requested or bead.resling_owed:
        return False, None
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


def _held_names(state: WitnessState, obs: Observed) -> dict[tuple[str, str], str]:
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


def _spawns(state: WitnessState, obs: Observed, policy: Policy) -> Iterator[Action]:
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
    held = _held_names(state, obs)
    in_use: dict[str, int] = {}
    for session in state.sessions.values():
        if session.status in ACTIVE_SESSION:
            in_use[session.rig] = in_use.get(session.rig, 0) + 1
    for rig_name, _polecat in obs.reserved:
        in_use[rig_name] = in_use.get(rig_name, 0) + 1
    for bead in waiting:
        if f"bead:{bead.id}" in obs.busy:
            continue
        rig = state.rigs[bead.rig or ""]
        if in_use.get(rig.name, 0) >= rig.max_polecats:
            continue  # queued: it gets a polecat when one of the rig's sessions ends
        spawn = _spawn_for(state, bead, rig, held, policy)
        held[(rig.name, spawn.polecat)] = bead.id
        in_use[rig.name] = in_use.get(rig.name, 0) + 1
        yield spawn


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
    attempt = len(bead.sessions) + 1
    branch = previous[0].branch if previous else f"polecat/{polecat}/{bead.id}"
    handoff_of = last.id if last is not None and last.end_reason == "handoff" else None
    return Spawn(
        bead=bead.id,
        session=session_id_for(bead.id, attempt),
        rig=rig.name,
        polecat=polecat,
        worktree=f"{policy.rigs_root}/{home_name(rig)}/polecats/{polecat}",
        branch=branch,
        tmux_name=tmux_name_for(rig.name, polecat),
        attempt=attempt,
        handoff_of=handoff_of,
        resling=last is not None and (last.end_reason in DEATHS or last.end_reason == AGENT_UNAUTHORIZED),
    )


# ---- after a session ended ---------------------------------------------------------------------


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


def _ended_sessions(state: WitnessState, obs: Observed, policy: Policy) -> Iterator[Action]:
    latest: dict[tuple[str, str], str] = {}  # filled once, when first needed
    for session in state.sessions.values():
        if session.status != "ended":
            continue
        hook = state.hooks.get(hook_lease_name(session.bead)) if session.lease_token is not None else None
        if hook is not None and hook.holder == session.id and hook.status == "held":
            yield ReleaseHook(session=session.id, bead=session.bead)
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
            yield Clean(session=session.id, remove_worktree=remove, detail="" if remove else "kept: bead unslung")
        elif _is_last_escalated(state, session):
            yield Clean(session=session.id, remove_worktree=False, detail="kept for manual recovery (escalated)")
        elif pane_of(session, obs) is not None and session.version <= obs.as_of_seq:
            yield ReapPane(session=session.id)


def _kept_after_its_bead_closed(state: WitnessState, session: Session, latest: dict[tuple[str, str], str]) -> bool:
    """Cleaned with its worktree kept (for manual recovery after an escalation, for the bead's next sling), and its
    bead closed since: the worktree is tried once more (never removed with unsaved work), so the polecat's name,
    which it holds while its worktree is there (``_held_names``), is free for other beads. ``latest``: (rig,
    polecat) -> the session that last had the name (a worktree carried on by a later one is not this one's)."""
    if session.worktree_removed or session.cleanings != 1:
        return False
    bead = state.beads.get(session.bead)
    if bead is not None and bead.status != "closed":
        return False
    if not latest:
        latest.update({(s.rig, s.polecat): s.id for s in state.sessions.values()})  # in the order requested
    return latest.get((session.rig, session.polecat)) == session.id


def may_linger(session: Session) -> bool:
    """Ended by `gt done` and not cleaned up yet: its agent may still be running, reading what `gt done` said."""
    return session.status == "ended" and session.end_reason == "done" and not session.cleaned


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


def _mass_deaths(state: WitnessState, obs: Observed, policy: Policy) -> Iterator[Action]:
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


def _orphans(state: WitnessState, obs: Observed, policy: Policy) -> Iterator[Action]:
    if obs.panes is None:
        return
    now = obs.now.timestamp()
    for pane in obs.panes.values():
        if not pane.name.startswith(TMUX_PREFIX) or pane.label in state.sessions:
            continue
        if now - pane.created >= policy.min_orphan_age_s:
            yield KillOrphan(tmux_name=pane.name, pane_pid=pane.pane_pid, created=pane.created)


def _nudges(state: WitnessState, obs: Observed) -> Iterator[Action]:
    for nudge in state.nudges.values():
        if nudge.status != "queued":
            continue
        if obs.now >= nudge.expires_at:
            yield ExpireNudge(nudge=nudge.id)
            continue
        target = _nudge_target(state, nudge.rig, nudge.polecat, nudge.session)
        if target is not None and target.status == "started":
            pane = pane_of(target, obs)
            if pane is None or pane.dead or not _takes_nudges_now(state, target, nudge.message, obs):
                continue
            yield DeliverNudge(nudge=nudge.id, session=target.id)


def _takes_nudges_now(state: WitnessState, session: Session, message: str, obs: Observed) -> bool:
    """A runtime that takes a nudge only when idle gets it then; one that queues input (or cannot tell) at once."""
    rig = state.rigs.get(session.rig)
    runtime = runtime_for(rig.agent_command if rig is not None else "")
    if runtime.nudge(message).when_busy:
        return True
    return session.id in obs.idle or not runtime.reads_screen  # a runtime whose screen is not read cannot tell


def _continuations(state: WitnessState, obs: Observed) -> Iterator[Action]:
    """Sessions whose agent restarted with a fresh context (``/clear``, a compaction) and has waited at its prompt
    since, no turn run: the nudge that sends them on with their current step (once per such start; an agent that
    went on by itself, as after a compaction in the middle of a turn, gets none)."""
    for session_id, restart in obs.restarts.items():
        session = state.sessions.get(session_id)
        if session is None or session.status != "started" or session.done_intent_at is not None:
            continue
        if restart.turn_ended_since or session_id not in obs.idle:
            continue
        if continue_nudge_id(session_id, restart.number) in state.nudges:
            continue
        yield ContinueSession(session=session_id, number=restart.number, source=restart.source)


def _mail(state: WitnessState, obs: Observed) -> Iterator[Action]:
    """Unread mail not yet announced, to a polecat with a live session: announce it (a polecat with none now is
    told when it next has one; its `gt prime` lists the mail in any case)."""
    for notice in state.mail.values():
        if notice.nudged:
            continue
        target = _nudge_target(state, notice.rig, notice.polecat, None)
        if target is not None and target.status == "started" and pane_of(target, obs) is not None:
            yield NudgeMail(message=notice.id)


def _nudge_target(state: WitnessState, rig: str, polecat: str, session_id: str | None) -> Session | None:
    if session_id is not None:
        named = state.sessions.get(session_id)
        if named is not None and named.status in ACTIVE_SESSION:
            return named
    current = None
    for session in state.sessions.values():
        if session.rig == rig and session.polecat == polecat and session.status in ACTIVE_SESSION:
            current = session
    return current
