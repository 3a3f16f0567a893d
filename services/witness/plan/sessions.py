"""Sessions that hold a hook (requested or started): each is started, given up on, or judged (dead, zombie,
refused, blocked at a screen, not confirmed in time, stuck in `gt done`, stalled) and warranted; a warranted one is
killed; one whose bead was closed or unslung is warranted to end cleanly."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

from services.witness.plan.actions import Action, ClaimBead, GiveUp, Kill, Start, Warrant
from services.witness.plan.observed import Observed, pane_of
from services.witness.plan.policy import Policy
from services.witness.state import Rig, Session, WitnessState, WorkBead, agent_of
from shared.core.ids import hook_lease_name
from shared.model import gates
from shared.model.events.molecules import StepGate
from shared.model.events.sessions import ACTIVE_SESSION
from shared.model.runtimes import confirms_start, pane_activity_counts

AGENT_UNAUTHORIZED = "agent_unauthorized"
"""The warrant (and end reason) of a session whose agent's credentials were refused: its rig is parked and the
operator told, as every new session would be refused too."""


def active_sessions(state: WitnessState, obs: Observed, policy: Policy) -> Iterator[Action]:
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
        if claim_owed(state, session):
            yield ClaimBead(session=session.id, bead=session.bead)
        if session.version > obs.as_of_seq or obs.panes is None:
            continue  # changed while we looked, or tmux unknown: judge it on the next observation
        warrant = _judge(session, bead, state.rigs.get(session.rig), obs, policy)
        if warrant is not None:
            yield warrant


def claim_owed(state: WitnessState, session: Session) -> bool:
    """Whether ``session`` is owed its bead's claim (``ClaimBead``): started, not handing in, holding its bead's hook
    while the bead is still ``hooked``."""
    bead = state.beads.get(session.bead)
    hook = state.hooks.get(hook_lease_name(session.bead))
    return (
        session.status == "started"
        and session.done_intent_at is None
        and bead is not None
        and bead.status == "hooked"
        and hook is not None
        and hook.held_by(session.id)
    )


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
    gone = None
    if pane is None:
        gone = Warrant(session=session.id, reason="dead", detail=f"tmux session {session.tmux_name} is gone")
    elif pane.dead or not obs.alive.get(session.id, True):
        gone = Warrant(
            session=session.id,
            reason="zombie",
            detail=f"tmux session {session.tmux_name} is there but its agent (pid {session.pane_pid}) is not",
        )
    if gone is not None:
        waiting = bead.waiting_gate() if session.done_intent_at is None else None
        # An agent that ended at a closed gate (nothing to do until it opens) is no death.
        return gone if waiting is None else _gate_wait(session, waiting, f"its agent ended ({gone.reason})")
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
                f"{agent_of(session, rig)} in tmux session {session.tmux_name}) showed no SessionStart hook: its pane "
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
    if rig is not None and (session.id in obs.start_confirmed or not confirms_start(agent_of(session, rig))):
        # A runtime that confirms its start is judged by the start deadline until it has: its boot is no stall.
        last = last_sign_of_life(session, bead, obs, pane_counts=pane_activity_counts(agent_of(session, rig)))
        quiet = (obs.now - last).total_seconds()
        waiting = bead.waiting_gate()
        if waiting is not None and quiet > policy.gate_quiet_s:
            # Nothing to do until the gate opens: the session ends cleanly (no death), a fresh one comes then.
            return _gate_wait(session, waiting, f"quiet for {quiet:.0f}s")
        if quiet > rig.stall_after_s:
            return Warrant(
                session=session.id,
                reason="stalled",
                detail=(
                    f"no heartbeat, step progress or agent activity for {quiet:.0f}s (limit {rig.stall_after_s:g}s)"
                ),
            )
    return None


def _gate_wait(session: Session, waiting: tuple[str, StepGate], why: str) -> Warrant:
    step, gate = waiting
    return Warrant(
        session=session.id, reason="gate_wait", detail=f"step {step} waits on its gate ({gates.describe(gate)}); {why}"
    )


def _unconfirmed_start(session: Session, rig: Rig | None, obs: Observed, policy: Policy) -> Warrant | None:
    """A session whose runtime confirms its start (a hook) and has not, past the deadline: its pane is up but the
    agent never got going (a dialog nobody answers, a crash before its first turn, a broken install)."""
    if rig is None or session.started_at is None or session.done_intent_at is not None:
        return None
    if session.id in obs.start_confirmed or not confirms_start(agent_of(session, rig)):
        return None
    waited = (obs.now - session.started_at).total_seconds()
    if waited <= policy.start_confirm_s:
        return None
    return Warrant(
        session=session.id,
        reason="failed_to_start",
        detail=(
            f"rig {rig.name}: session {session.id} ({agent_of(session, rig)} in tmux session {session.tmux_name}) "
            f"showed no SessionStart hook {waited:.0f}s after its pane started (limit {policy.start_confirm_s:g}s)"
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
