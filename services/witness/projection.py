"""The witness's projection: its own events (rigs, sessions, nudges) and the mayor's and refinery's events
it needs (beads slung to its rigs, their steps, merge requests). Pure: no I/O, no clock."""

from __future__ import annotations

import functools
from datetime import datetime

import msgspec

from services.witness.state import (
    MAIL_NUDGE_PREFIX,
    MAX_NOTICES,
    TOWN_AGENT_LAUNCHES_KEPT,
    MailNotice,
    MergeFailure,
    Nudge,
    Session,
    TownAgent,
    TownAgentAsk,
    TownAgentNotice,
    UsageMark,
    WitnessState,
    WorkBead,
    mail_nudge_id,
)
from shared.core.ids import HOOK_LEASE_PREFIX, hook_lease_name
from shared.model.commands.mail import polecat_of
from shared.model.crew import Crew, crew_key
from shared.model.events import (
    DEATHS,
    BeadClaimed,
    BeadClosed,
    BeadCreated,
    BeadSlung,
    BeadUnslung,
    BeadUpdated,
    CrewAdded,
    CrewEvent,
    CrewHooked,
    CrewReady,
    CrewRemoved,
    CrewWorkspaceRemoved,
    Envelope,
    EscalationRaised,
    Event,
    GateOpened,
    GcSwept,
    LeaseAcquired,
    LeaseEvent,
    MergeRequestConflicted,
    MergeRequestFailed,
    MergeRequestMerged,
    MergeRequestRejected,
    MergeRequestRequeued,
    MergeRequestSubmitted,
    MoleculeAttached,
    NudgeDelivered,
    NudgeExpired,
    NudgeQueued,
    ReworkAdded,
    RigEvent,
    RigMassDeath,
    RigUnparked,
    RigUpdated,
    SessionCleaned,
    SessionDoneIntent,
    SessionEnded,
    SessionEscalated,
    SessionHookRecovered,
    SessionRequested,
    SessionStarted,
    SessionUsage,
    SessionWarranted,
    StepCompleted,
    StepStarted,
    TownAgentAnswered,
    TownAgentAskDelivered,
    TownAgentAsked,
    TownAgentEvent,
    TownAgentLaunched,
    TownAgentStarted,
    TownAgentStopped,
    TownAgentTold,
)
from shared.model.events.beads import WORKING, forward
from shared.model.events.sessions import ACTIVE_SESSION
from shared.model.fold import advance, touch
from shared.model.leases import fold_lease
from shared.model.rigs import fold_rig
from shared.service.projection import Projection

SCHEMA_VERSION = 15
"""6: hook leases are the one lease record (``shared.model.leases.Lease``): a snapshot from before has them
without when they were acquired and ended. 7: ``rework_owed`` (a snapshot from before would start a session
for work sent back before its rework steps). 8: sessions count the steps done
while they worked and their clean-ups, beads where their last operator sling began (the respawn backoff, a polecat
name freed once its bead closed): a snapshot from before has none of them, so the log is replayed instead.
10: the rigs whose mass death is not over (a snapshot from before would escalate a rig's next deaths again).
11: rigs' ``gate_pristine``. 12: beads' ``agent`` (``gt sling --agent``): a snapshot an older witness made may have
folded a sling's agent without keeping it. 13: nudges' ``bead`` (a snapshot from before has queued nudges
without the bead they are about). 14: town agents (``town_agent.*``)."""
SKIPPED_TYPES = frozenset({"message", "convoy", "escalation"})
MESSAGE_TYPE = "message"
READ_LABEL = "read"


@functools.singledispatch
def fold(payload: Event, state: WitnessState, env: Envelope, seq: int) -> None:
    """Events the witness does not track change nothing."""


# ---- rigs --------------------------------------------------------------------------------------


@fold.register
def _rig(payload: RigEvent, state: WitnessState, env: Envelope, seq: int) -> None:
    fold_rig(payload, state.rigs, env, seq)
    if isinstance(payload, RigUpdated | RigUnparked):
        # The operator acted on the rig: deaths from now on are news again.
        state.mass_deaths_open.discard(payload.rig)


@fold.register
def _mass_death(payload: RigMassDeath, state: WitnessState, env: Envelope, seq: int) -> None:
    fold_rig(payload, state.rigs, env, seq)
    covered = state.mass_deaths.setdefault(payload.rig, [])
    covered.extend(s for s in payload.sessions if s not in covered)
    state.mass_deaths_open.add(payload.rig)


# ---- beads (the mayor's events) ----------------------------------------------------------------


@fold.register
def _bead_created(payload: BeadCreated, state: WitnessState, env: Envelope, seq: int) -> None:
    if payload.type == MESSAGE_TYPE:
        _mail_created(payload, state)
    elif payload.type not in SKIPPED_TYPES and payload.bead_id not in state.beads:
        state.beads[payload.bead_id] = WorkBead(id=payload.bead_id, title=payload.title)


def _mail_created(payload: BeadCreated, state: WitnessState) -> None:
    """A message to a polecat: its live session is to be told (``plan._mail``); to a running town agent
    (``mayor``): it is told when it waits at its prompt."""
    if (payload.assignee or "") in state.town_agents:
        sender = payload.metadata.get("from", "someone")
        notice = TownAgentNotice(id=payload.bead_id, kind="mail", sender=sender, subject=payload.title)
        _notify_town_agent(state, payload.assignee or "", notice)
        return
    addressed = polecat_of(payload.assignee or "")
    if addressed is None or payload.bead_id in state.mail:
        return
    state.mail[payload.bead_id] = MailNotice(
        id=payload.bead_id,
        rig=addressed[0],
        polecat=addressed[1],
        sender=payload.metadata.get("from", "someone"),
        subject=payload.title,
    )


@fold.register
def _bead_updated(payload: BeadUpdated, state: WitnessState, env: Envelope, seq: int) -> None:
    if payload.bead_id in state.mail and READ_LABEL in (payload.add_labels or ()):
        del state.mail[payload.bead_id]  # read: nothing more to tell
    if READ_LABEL in (payload.add_labels or ()):
        for agent in state.town_agents.values():
            agent.notices = [n for n in agent.notices if (n.kind, n.id) != ("mail", payload.bead_id)]
    bead = state.beads.get(payload.bead_id)
    if bead is not None and not isinstance(payload.title, msgspec.UnsetType):
        bead.title = payload.title  # the next session's beacon names it as it is now


@fold.register
def _bead_slung(payload: BeadSlung, state: WitnessState, env: Envelope, seq: int) -> None:
    bead = state.beads.get(payload.bead_id)
    if bead is None:
        return
    bead.status = forward(bead.status, "hooked")
    bead.rig = payload.rig
    bead.slings += 1
    bead.slung_seq = seq
    bead.merge_requested = False  # a new sling (rework) needs a new session and a new merge request
    bead.merge_rejected = False
    bead.resling_owed = False
    bead.unslung = bead.unsling_remove_worktree = False
    if payload.agent is not None:
        bead.agent = payload.agent
    bead.last_progress_at = env.ts
    if payload.session is not None and payload.session in bead.sessions:
        # The witness's re-sling names the session it already requested: that one serves this sling.
        bead.sessions_at_sling = bead.sessions.index(payload.session)
    else:
        bead.sessions_at_sling = len(bead.sessions)
    if payload.session is None:
        bead.deaths_at_sling = deaths(state, bead)
        bead.sessions_at_operator_sling = len(bead.sessions)


@fold.register
def _bead_unslung(payload: BeadUnslung, state: WitnessState, env: Envelope, seq: int) -> None:
    bead = state.beads.get(payload.bead_id)
    if bead is None or bead.status not in WORKING:
        return
    bead.status = "open"
    bead.unslung = True
    bead.unsling_remove_worktree = payload.remove_worktree
    bead.resling_owed = False


def deaths(state: WitnessState, bead: WorkBead) -> int:
    """How many of the bead's sessions died (not counting done or handed-off ones)."""
    return sum(1 for sid in bead.sessions if (s := state.sessions.get(sid)) is not None and s.end_reason in DEATHS)


@fold.register
def _bead_claimed(payload: BeadClaimed, state: WitnessState, env: Envelope, seq: int) -> None:
    if (bead := state.beads.get(payload.bead_id)) is not None:
        bead.status = forward(bead.status, "in_progress")


@fold.register
def _bead_closed(payload: BeadClosed, state: WitnessState, env: Envelope, seq: int) -> None:
    state.mail.pop(payload.bead_id, None)  # an archived message
    bead = state.beads.get(payload.bead_id)
    if bead is not None:
        bead.status = "closed"
        bead.closed_at = bead.closed_at or env.ts


@fold.register
def _molecule(payload: MoleculeAttached, state: WitnessState, env: Envelope, seq: int) -> None:
    bead = state.beads.get(payload.bead_id)
    if bead is not None and not bead.steps:
        bead.steps = [s.id for s in payload.steps]
        bead.current_step = bead.steps[0] if bead.steps else None
        bead.last_progress_at = env.ts
        bead.gates.add_steps(payload.steps, env.ts)


@fold.register
def _rework(payload: ReworkAdded, state: WitnessState, env: Envelope, seq: int) -> None:
    """The mayor appended rework steps for work sent back: its current step is the first of them, and the bead may
    have its session now."""
    bead = state.beads.get(payload.bead_id)
    if bead is None:
        return
    bead.steps.extend(s.id for s in payload.steps if s.id not in bead.steps)
    bead.current_step = next((s for s in bead.steps if s not in bead.done_steps), None)
    bead.rework_owed = False
    bead.gates.add_steps(payload.steps, env.ts)


@fold.register
def _gate_opened(payload: GateOpened, state: WitnessState, env: Envelope, seq: int) -> None:
    """The bead's gate opened: it may have its session again (``needs_session``), its progress moved."""
    bead = _progress(state, payload.bead_id, env)
    if bead is not None:
        bead.gates.gate_opened(payload.step)


def _progress(state: WitnessState, bead_id: str, env: Envelope) -> WorkBead | None:
    bead = state.beads.get(bead_id)
    if bead is not None:
        bead.last_progress_at = env.ts
    return bead


@fold.register
def _step_started(payload: StepStarted, state: WitnessState, env: Envelope, seq: int) -> None:
    _progress(state, payload.bead_id, env)


@fold.register
def _step_done(payload: StepCompleted, state: WitnessState, env: Envelope, seq: int) -> None:
    bead = _progress(state, payload.bead_id, env)
    if bead is None or payload.step in bead.done_steps:
        return
    bead.done_steps.append(payload.step)
    bead.current_step = next((s for s in bead.steps if s not in bead.done_steps), None)
    bead.gates.step_done(payload.step, env.ts)
    working = state.sessions.get(bead.sessions[-1]) if bead.sessions else None
    if working is not None and working.status in ACTIVE_SESSION:
        working.steps_done += 1


@fold.register
def _merge_requested(payload: MergeRequestSubmitted, state: WitnessState, env: Envelope, seq: int) -> None:
    state.mr_beads[payload.mr_id] = payload.bead
    if payload.session is None:
        state.hand_mr_rigs[payload.mr_id] = payload.rig
    bead = state.beads.get(payload.bead)
    if bead is not None:
        bead.merge_requested = True
        bead.merge_rejected = False


@fold.register
def _merged(payload: MergeRequestMerged, state: WitnessState, env: Envelope, seq: int) -> None:
    """Its rig's base moved (``already``: by a push an earlier attempt made): clones fetched before lack it."""
    bead = state.beads.get(state.mr_beads.get(payload.mr_id, ""))
    rig = bead.rig if bead is not None else None
    # Submitted by hand (a crew member's `gt done`): its bead was never slung to the rig.
    rig = rig or state.hand_mr_rigs.pop(payload.mr_id, None)
    if rig is not None:
        state.base_merged[rig] = seq


@fold.register
def _merge_requeued(payload: MergeRequestRequeued, state: WitnessState, env: Envelope, seq: int) -> None:
    """The merge request that sent the bead back is in the queue again (its bead resubmitted the same commit, or
    an operator retried it): the bead waits for the merge queue again, not for a session. Other requeues (a
    conflict resolved, the target moved) change nothing here: their bead waits for the queue already, or was
    slung again for rework and needs its session."""
    bead = state.beads.get(state.mr_beads.get(payload.mr_id, ""))
    sent_back_by = bead.merge_failure.mr if bead is not None and bead.merge_failure is not None else None
    if bead is not None and bead.status != "closed" and sent_back_by == payload.mr_id:
        bead.merge_requested = True
        bead.merge_rejected = False
        bead.returned = False


@fold.register
def _merge_rejected(payload: MergeRequestRejected, state: WitnessState, env: Envelope, seq: int) -> None:
    bead = state.beads.get(state.mr_beads.get(payload.mr_id, ""))
    if bead is not None and bead.status != "closed":
        bead.merge_requested = False
        bead.merge_rejected = True


@fold.register
def _merge_failed(payload: MergeRequestFailed, state: WitnessState, env: Envelope, seq: int) -> None:
    """The refinery sent the work back: the bead needs a session again, told why (unless escalated)."""
    bead = state.beads.get(state.mr_beads.get(payload.mr_id, ""))
    if bead is None or payload.escalated:
        return
    bead.merge_requested = False
    bead.returned = True
    bead.rework_owed = bool(bead.steps)  # the mayor appends rework steps to a molecule (there is none without)
    bead.merge_failure = MergeFailure(
        mr=payload.mr_id, gate=payload.gate, exit_code=payload.exit_code, tail=payload.tail
    )


@fold.register
def _merge_conflicted(payload: MergeRequestConflicted, state: WitnessState, env: Envelope, seq: int) -> None:
    """A conflict sent back to the agent: the bead needs a session again, told to rebase and resolve (one for
    the operator blocks the merge request on a conflict bead instead, and the bead waits)."""
    bead = state.beads.get(state.mr_beads.get(payload.mr_id, ""))
    if bead is None or not payload.sent_back:
        return
    bead.merge_requested = False
    bead.returned = True
    bead.rework_owed = bool(bead.steps)
    bead.merge_failure = MergeFailure(
        mr=payload.mr_id,
        gate="conflict",
        exit_code=0,
        files=list(payload.files),
        target_commit=payload.target_commit,
    )


# ---- sessions ----------------------------------------------------------------------------------


@fold.register
def _requested(payload: SessionRequested, state: WitnessState, env: Envelope, seq: int) -> None:
    if payload.session_id in state.sessions:
        return
    state.sessions[payload.session_id] = Session(
        id=payload.session_id,
        rig=payload.rig,
        polecat=payload.polecat,
        bead=payload.bead,
        worktree=payload.worktree,
        branch=payload.branch,
        tmux_name=payload.tmux_name,
        attempt=payload.attempt,
        handoff_of=payload.handoff_of,
        agent=payload.agent,
        requested_at=env.ts,
        version=seq,
    )
    bead = state.beads.get(payload.bead)
    if bead is not None and payload.session_id not in bead.sessions:
        bead.sessions.append(payload.session_id)
        bead.returned = bead.rework_owed = False


@fold.register
def _started(payload: SessionStarted, state: WitnessState, env: Envelope, seq: int) -> None:
    if (session := advance(state.sessions, payload.session_id, seq, "started", only_from=("requested",))) is not None:
        session.started_at = env.ts
        session.pane_pid = payload.pane_pid
        session.pid_started = payload.pid_started
        session.adopted = payload.adopted


@fold.register
def _done_intent(payload: SessionDoneIntent, state: WitnessState, env: Envelope, seq: int) -> None:
    session = touch(state.sessions, payload.session_id, seq)
    if session is not None and session.done_intent_at is None:
        session.done_intent_at = env.ts


@fold.register
def _warranted(payload: SessionWarranted, state: WitnessState, env: Envelope, seq: int) -> None:
    session = touch(state.sessions, payload.session_id, seq)
    if session is not None and session.warrant_reason is None:
        session.warrant_reason = payload.reason
        session.warrant_detail = payload.detail
        session.pane_tail = payload.pane_tail
        session.warranted_at = env.ts


@fold.register
def _ended(payload: SessionEnded, state: WitnessState, env: Envelope, seq: int) -> None:
    if (session := advance(state.sessions, payload.session_id, seq, "ended")) is not None:
        session.ended_at, session.end_reason, session.end_detail = env.ts, payload.reason, payload.detail
        if payload.reason == "done":
            state.mass_deaths_open.discard(session.rig)  # what the rig's sessions share works again
        elif payload.reason in DEATHS and session.rig in state.mass_deaths_open:
            # One cause, one escalation: the open one already says the rig's sessions die.
            state.mass_deaths.setdefault(session.rig, []).append(session.id)


@fold.register
def _cleaned(payload: SessionCleaned, state: WitnessState, env: Envelope, seq: int) -> None:
    session = touch(state.sessions, payload.session_id, seq)
    if session is not None:
        session.cleaned = True
        session.worktree_removed = payload.worktree_removed
        session.cleanings += 1
        if payload.pane_tail and not session.pane_tail:
            session.pane_tail = payload.pane_tail
        if payload.transcript_tail:
            session.transcript_tail = payload.transcript_tail


@fold.register
def _escalated(payload: SessionEscalated, state: WitnessState, env: Envelope, seq: int) -> None:
    session = touch(state.sessions, payload.session_id, seq)
    if session is not None and session.escalated is None:
        session.escalated = payload.reason


@fold.register
def _hook_recovered(payload: SessionHookRecovered, state: WitnessState, env: Envelope, seq: int) -> None:
    session = touch(state.sessions, payload.session_id, seq)
    if session is None or session.hook_recovery is not None:
        return
    session.hook_recovery = payload.resolution
    session.hook_recovery_detail = payload.detail
    bead = state.beads.get(payload.bead)
    if bead is not None and payload.resolution == "resling":
        bead.stale_recoveries += 1
        bead.resling_owed = True


# ---- hook leases -------------------------------------------------------------------------------


@fold.register
def _hook_lease(payload: LeaseEvent, state: WitnessState, env: Envelope, seq: int) -> None:
    if not payload.lease.startswith(HOOK_LEASE_PREFIX):
        return
    fold_lease(payload, state.hooks, env, seq)
    if not isinstance(payload, LeaseAcquired):
        return
    session = state.sessions.get(payload.holder)
    if session is not None and session.lease_token is None:
        session.lease_token = payload.token


# ---- nudges ------------------------------------------------------------------------------------


# ---- crew (docs/crew.md) --------------------------------------------------------------------------


@fold.register
def _crew(payload: CrewEvent, state: WitnessState, env: Envelope, seq: int) -> None:
    key = crew_key(payload.rig, payload.name)
    crew = state.crews.get(key)
    if isinstance(payload, CrewAdded):
        if crew is None or crew.gone:  # new, or added again after its workspace went: a member anew
            version = crew.version if crew is not None else 0
            crew = state.crews[key] = Crew(
                rig=payload.rig, name=payload.name, branch=payload.branch, workspace=payload.workspace, added_at=env.ts
            )
            crew.version = version
        # Added again after a removal that kept its workspace: used again, once the witness has looked that it is
        # there (made again if a removal raced this and took it).
        crew.status, crew.kept, crew.ready = "added", "", False
    if crew is None:
        return
    crew.version = seq
    match payload:
        case CrewReady():
            crew.ready = True
        case CrewHooked():
            crew.hooked = payload.bead
        case CrewRemoved():
            crew.status = "removed"
        case CrewWorkspaceRemoved() if payload.removed:
            crew.gone, crew.ready, crew.hooked = True, False, None  # kept for its version: a re-add expects it
        case CrewWorkspaceRemoved():
            crew.kept = payload.detail or "kept"


# ---- town agents (docs/mayor-agent.md) -------------------------------------------------------------


@fold.register
def _town_agent(payload: TownAgentEvent, state: WitnessState, env: Envelope, seq: int) -> None:
    agent = state.town_agents.get(payload.name)
    if isinstance(payload, TownAgentStarted):
        if agent is None:
            agent = state.town_agents[payload.name] = TownAgent(name=payload.name, agent=payload.agent)
        agent.wanted, agent.agent = True, payload.agent
    if agent is None:
        return
    agent.version = seq
    match payload:
        case TownAgentStopped():
            agent.wanted = False
            agent.asks = []
        case TownAgentLaunched():
            agent.run, agent.pane_pid, agent.pid_started = payload.run, payload.pane_pid, payload.pid_started
            agent.launched_at = env.ts
            agent.launches = [*agent.launches, env.ts][-TOWN_AGENT_LAUNCHES_KEPT:]
        case TownAgentAsked():
            if all(ask.id != payload.ask_id for ask in agent.asks):
                agent.asks.append(TownAgentAsk(id=payload.ask_id, text=payload.text, asked_at=env.ts))
        case TownAgentAskDelivered():
            for ask in agent.asks:
                if ask.id == payload.ask_id:
                    ask.delivered_run, ask.delivered_at = payload.run, env.ts
                    ask.transcript, ask.offset = payload.transcript, payload.offset
        case TownAgentAnswered():
            agent.asks = [ask for ask in agent.asks if ask.id != payload.ask_id]
        case TownAgentTold():
            agent.notices = [n for n in agent.notices if n.id != payload.notice]


def _notify_town_agent(state: WitnessState, name: str, notice: TownAgentNotice) -> None:
    """A notice for a running town agent (one stopped, or never started, reads it in its prime when started)."""
    agent = state.town_agents.get(name)
    if agent is None or not agent.wanted or any(n.id == notice.id for n in agent.notices):
        return
    agent.notices = [*agent.notices, notice][-MAX_NOTICES:]


@fold.register
def _escalation_raised(payload: EscalationRaised, state: WitnessState, env: Envelope, seq: int) -> None:
    for name in state.town_agents:
        if payload.source != f"agent:{name}":  # its own escalation is not news to it
            notice = TownAgentNotice(
                id=payload.escalation_id,
                kind="escalation",
                sender=payload.source,
                subject=payload.message,
                severity=payload.severity,
            )
            _notify_town_agent(state, name, notice)


@fold.register
def _nudge_queued(payload: NudgeQueued, state: WitnessState, env: Envelope, seq: int) -> None:
    if payload.nudge_id not in state.nudges:
        state.nudges[payload.nudge_id] = Nudge(
            id=payload.nudge_id,
            rig=payload.rig,
            polecat=payload.polecat,
            session=payload.session,
            bead=payload.bead,
            message=payload.message,
            queued_at=env.ts,
            expires_at=payload.expires_at,
            version=seq,
        )
    if payload.nudge_id.startswith(MAIL_NUDGE_PREFIX):
        notice = state.mail.get(payload.nudge_id.removeprefix(MAIL_NUDGE_PREFIX))
        if notice is not None:
            notice.nudged = True


@fold.register
def _nudge_delivered(payload: NudgeDelivered, state: WitnessState, env: Envelope, seq: int) -> None:
    if (nudge := advance(state.nudges, payload.nudge_id, seq, "delivered", only_from=("queued",))) is not None:
        nudge.delivered_to = payload.session


@fold.register
def _nudge_expired(payload: NudgeExpired, state: WitnessState, env: Envelope, seq: int) -> None:
    advance(state.nudges, payload.nudge_id, seq, "expired", only_from=("queued",))


# ---- garbage collection ------------------------------------------------------------------------


def collectable(state: WitnessState, bead: WorkBead, cutoff: datetime, latest: dict[tuple[str, str], str]) -> bool:
    """A bead closed before ``cutoff`` that nothing is left to do for: each of its sessions ended and was
    cleaned, none still holds a polecat name (the latest session of a name whose worktree stays, e.g. kept
    for manual recovery), and its hook lease is not held. ``latest``: (rig, polecat) -> its latest session.

    A bead that is not closed is never collected: its sessions are numbered by how many it had."""
    if bead.status != "closed" or bead.closed_at is None or bead.closed_at >= cutoff:
        return False
    for session_id in bead.sessions:
        session = state.sessions.get(session_id)
        if session is None:
            continue
        if session.status != "ended" or not session.cleaned:
            return False
        if latest.get((session.rig, session.polecat)) == session.id and not session.worktree_removed:
            return False
    hook = state.hooks.get(hook_lease_name(bead.id))
    return hook is None or hook.status != "held"


@fold.register
def _gc_swept(payload: GcSwept, state: WitnessState, env: Envelope, seq: int) -> None:
    """Closed beads that are done with (see ``collectable``) leave with their sessions, merge request links,
    hook lease and mass-death marks; nudges delivered or expired before the cutoff leave too, and so does the
    record of unread mail whose announcement left."""
    cutoff = payload.cutoff
    latest = {(s.rig, s.polecat): s.id for s in state.sessions.values()}
    gone = [b for b in state.beads.values() if collectable(state, b, cutoff, latest)]
    dropped: set[str] = set()
    for bead in gone:
        del state.beads[bead.id]
        for session_id in bead.sessions:
            if state.sessions.pop(session_id, None) is not None:
                dropped.add(session_id)
        state.hooks.pop(hook_lease_name(bead.id), None)
    if gone:
        ids = {b.id for b in gone}
        for mr_id in [m for m, b in state.mr_beads.items() if b in ids]:
            del state.mr_beads[mr_id]
    if dropped:
        for rig, covered in list(state.mass_deaths.items()):
            kept = [s for s in covered if s not in dropped]
            if not kept:
                del state.mass_deaths[rig]
            elif len(kept) != len(covered):
                state.mass_deaths[rig] = kept
    for nudge_id in [n.id for n in state.nudges.values() if n.status != "queued" and n.expires_at < cutoff]:
        del state.nudges[nudge_id]
    # Unread mail announced long ago: nothing more is owed for it (`gt prime` lists it from the mayor's state).
    for message_id in [m.id for m in state.mail.values() if m.nudged and mail_nudge_id(m.id) not in state.nudges]:
        del state.mail[message_id]


@fold.register
def _session_usage(payload: SessionUsage, state: WitnessState, env: Envelope, seq: int) -> None:
    state.usage[payload.session_id] = UsageMark(
        version=seq,
        models=payload.models,
        final=payload.final,
        context_tokens=payload.context_tokens,
        context_window=payload.context_window,
    )


def new_projection() -> Projection[WitnessState]:
    return Projection(
        "witness", WitnessState, fold, schema_version=SCHEMA_VERSION, snapshot_after=frozenset({GcSwept.TYPE})
    )
