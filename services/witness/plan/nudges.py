"""Nudges owed: a queued nudge delivered to its session when its runtime takes one (or expired), the nudge that
sends a restarted agent on, the one that tells an agent its context is filling up, the announcement of unread
mail."""

from __future__ import annotations

from collections.abc import Iterator

from services.witness.plan.actions import (
    Action,
    ContinueSession,
    DeliverNudge,
    ExpireNudge,
    NudgeMail,
    WarnContext,
)
from services.witness.plan.observed import Observed, pane_of
from services.witness.state import Session, WitnessState, agent_of, context_nudge_id, continue_nudge_id
from shared.model.events.sessions import ACTIVE_SESSION
from shared.model.runtimes import runtime_for


def queued_nudges(state: WitnessState, obs: Observed) -> Iterator[Action]:
    for nudge in state.nudges.values():
        if nudge.status != "queued":
            continue
        if obs.now >= nudge.expires_at:
            yield ExpireNudge(nudge=nudge.id)
            continue
        about = state.beads.get(nudge.bead) if nudge.bead is not None else None
        if about is not None and about.status == "closed":
            yield ExpireNudge(nudge=nudge.id, reason="bead_closed")  # its work is over: no later one's to hear it
            continue
        target = _nudge_target(state, nudge.rig, nudge.polecat, nudge.session, nudge.bead)
        if target is not None and target.status == "started":
            pane = pane_of(target, obs)
            if pane is None or pane.dead or not _takes_nudges_now(state, target, nudge.message, obs):
                continue
            yield DeliverNudge(nudge=nudge.id, session=target.id)


def _takes_nudges_now(state: WitnessState, session: Session, message: str, obs: Observed) -> bool:
    """A runtime that takes a nudge only when idle gets it then; one that queues input (or cannot tell) at once."""
    rig = state.rigs.get(session.rig)
    runtime = runtime_for(agent_of(session, rig))
    if runtime.nudge(message).when_busy:
        return True
    return session.id in obs.idle or not runtime.reads_screen  # a runtime whose screen is not read cannot tell


def continuations(state: WitnessState, obs: Observed) -> Iterator[Action]:
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


def context_pressure(state: WitnessState, shares: tuple[float, ...]) -> Iterator[Action]:
    """Running sessions whose newest answer's request carried more than a share of their model's context window:
    the nudge that tells them to hand off, for the highest share passed, once (a session that passes two at once
    is told once; none after its `gt done`, none when the window is unknown)."""
    for session_id, mark in state.usage.items():
        if not shares or mark.final or mark.context_window <= 0:
            continue
        used = mark.context_tokens / mark.context_window
        passed = [share for share in shares if used >= share]
        if not passed:
            continue
        session = state.sessions.get(session_id)
        if session is None or session.status != "started" or session.done_intent_at is not None:
            continue
        if any(context_nudge_id(session_id, share) in state.nudges for share in shares if share >= passed[-1]):
            continue
        yield WarnContext(session=session_id, share=passed[-1], used=min(100, int(used * 100)))


def unannounced_mail(state: WitnessState, obs: Observed) -> Iterator[Action]:
    """Unread mail not yet announced, to a polecat with a live session: announce it (a polecat with none now is
    told when it next has one; its `gt prime` lists the mail in any case)."""
    for notice in state.mail.values():
        if notice.nudged:
            continue
        target = _nudge_target(state, notice.rig, notice.polecat, None)
        if target is not None and target.status == "started" and pane_of(target, obs) is not None:
            yield NudgeMail(message=notice.id)


def _nudge_target(
    state: WitnessState, rig: str, polecat: str, session_id: str | None, bead: str | None = None
) -> Session | None:
    """The session to type into: the one named while it is active, else the polecat's active one (of ``bead``,
    when the nudge is about one: a fresh session of the same bead hears it, the next bead's does not)."""
    if session_id is not None:
        named = state.sessions.get(session_id)
        if named is not None and named.status in ACTIVE_SESSION:
            return named
    current = None
    for session in state.sessions.values():
        ours = session.rig == rig and session.polecat == polecat and session.status in ACTIVE_SESSION
        if ours and (bead is None or session.bead == bead):
            current = session
    return current
