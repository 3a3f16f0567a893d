"""The witness's decisions on commands: rigs, the agent side of sessions (done, handoff) and nudges. Pure."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec

from services.witness.plan.names import POOL, POOLED_NAME
from services.witness.state import Crew, Rig, Session, TownAgent, WitnessState, crew_of_bead
from shared.core.errors import CommandError
from shared.core.ids import hook_lease_name
from shared.model import commands as cmds
from shared.model import gates
from shared.model.commands.actors import TOWN_AGENT_PREFIX
from shared.model.crew import crew_branch, crew_key
from shared.model.decision import Accepted, DecideContext, NewEvent
from shared.model.events import (
    CrewAdded,
    CrewHooked,
    CrewRemoved,
    NudgeQueued,
    RigAdded,
    RigParked,
    RigRemoved,
    RigUnparked,
    RigUpdated,
    SessionDoneIntent,
    SessionEnded,
    SessionHookRecovered,
    SessionWarranted,
    TownAgentAsked,
    TownAgentStarted,
    TownAgentStopped,
)
from shared.model.events.beads import WORKING
from shared.model.events.sessions import ACTIVE_SESSION
from shared.model.results import (
    UNSET,
    CrewResult,
    NudgeResult,
    RigResult,
    SessionResult,
    StaleHookResult,
    TownAgentResult,
    UnsetType,
)
from shared.model.runtimes import RUNTIMES, runtime_for

NUDGE_PREFIX = "nd"


class RepoFacts:
    """What ``prepare`` found out about a rig's repository before ``rig.add`` is decided."""

    __slots__ = ("problem",)

    def __init__(self, problem: str | None) -> None:
        self.problem = problem
        """Why the repository cannot be used (None: it can)."""


class WorktreeFacts:
    """What ``prepare`` found in the worktree of a bead's last session before a stale hook is decided."""

    __slots__ = ("at_risk",)

    def __init__(self, at_risk: str | None) -> None:
        self.at_risk = at_risk
        """Work that a re-sling could lose (uncommitted changes, unpushed commits); None: clean or gone."""


class CrewFacts:
    """What ``prepare`` found before a crew command is decided: where the member's workspace is, and what its
    removal would lose (uncommitted changes, unpushed commits; None: nothing)."""

    __slots__ = ("at_risk", "workspace")

    def __init__(self, workspace: str, at_risk: str | None = None) -> None:
        self.workspace = workspace
        self.at_risk = at_risk


class TownAgentFacts:
    """What ``prepare`` found before ``agent.start`` is decided: why no town agent may run here (its OS user)."""

    __slots__ = ("problem",)

    def __init__(self, problem: str | None) -> None:
        self.problem = problem


def decide(state: WitnessState, cmd: cmds.Command, ctx: DecideContext) -> Accepted:
    match cmd:
        case cmds.RigAdd():
            return rig_add(state, cmd, ctx)
        case cmds.RigUpdate():
            return rig_update(state, cmd)
        case cmds.RigPark():
            return rig_park(state, cmd)
        case cmds.RigUnpark():
            return rig_unpark(state, cmd)
        case cmds.RigRemove():
            return rig_remove(state, cmd)
        case cmds.SessionDoneIntentCmd():
            return done_intent(state, cmd)
        case cmds.SessionFinish():
            return finish(state, cmd)
        case cmds.SessionHandoff():
            return handoff(state, cmd)
        case cmds.SessionStop():
            return stop(state, cmd)
        case cmds.NudgeSend():
            return nudge(state, cmd, ctx)
        case cmds.SessionRecoverHook():
            return recover_hook(state, cmd, ctx)
        case cmds.CrewAdd():
            return crew_add(state, cmd, ctx)
        case cmds.CrewHook():
            return crew_hook(state, cmd)
        case cmds.CrewRemove():
            return crew_remove(state, cmd, ctx)
        case cmds.TownAgentStart():
            return town_agent_start(state, cmd, ctx)
        case cmds.TownAgentStop():
            return town_agent_stop(state, cmd)
        case cmds.TownAgentAsk():
            return town_agent_ask(state, cmd, ctx)
    raise CommandError("unknown_command", f"the witness does not handle {cmd.SUBJECT}")


# ---- rigs --------------------------------------------------------------------------------------


def _rig_from(cmd: cmds.RigAdd) -> RigAdded:
    return RigAdded(
        rig=cmd.name,
        repo=cmd.repo,
        base_branch=cmd.base_branch,
        prefix=cmd.rig_prefix(),
        setup_command=cmd.setup_command,
        lint_command=cmd.lint_command,
        test_command=cmd.test_command,
        agent_command=cmd.agent_command,
        max_polecats=cmd.max_polecats,
        max_respawns=cmd.max_respawns,
        stall_after_s=cmd.stall_after_s,
        git_name=cmd.git_name,
        git_email=cmd.git_email,
        gate_env=cmd.gate_env,
        gate_pristine=cmd.gate_pristine,
    )


def _added(name: str, rig: Rig | RigAdded, *, changed: bool, incarnation: int | UnsetType = UNSET) -> RigResult:
    return RigResult(
        id=name,
        status="added",
        changed=changed,
        rig=rig.name if isinstance(rig, Rig) else rig.rig,
        repo=rig.repo,
        base_branch=rig.base_branch,
        prefix=rig.prefix,
        incarnation=incarnation,
    )


def _same_config(rig: Rig, wanted: RigAdded) -> bool:
    return all(
        getattr(rig, field) == getattr(wanted, field)
        for field in ("repo", "base_branch", "prefix", *cmds.RigUpdate.SETTINGS)
    )


def _quiet(state: WitnessState, rig: Rig) -> None:
    """A removed rig whose name is added again has nothing left at work: no bead hooked to it (which the new rig
    would take up) and no session running on it.

    Raises:
        CommandError: ``conflict`` naming what is left.
    """
    hooked = hooked_beads(state, rig.name)
    running = sorted(s.id for s in state.sessions.values() if s.rig == rig.name and s.status in ACTIVE_SESSION)
    if not hooked and not running:
        return
    left = [f"beads still hooked to it: {', '.join(hooked[:20])}"] if hooked else []
    left += [f"sessions still running: {', '.join(running[:20])}"] if running else []
    raise CommandError(
        "conflict",
        f"removed rig {rig.name} still has work: {'; '.join(left)}; unsling the beads (`gt unsling BEAD`) and let "
        "the sessions end before its name is added again",
    )


def rig_add(state: WitnessState, cmd: cmds.RigAdd, ctx: DecideContext) -> Accepted[RigResult]:
    wanted = _rig_from(cmd)
    existing = state.rigs.get(cmd.name)
    if existing is not None and existing.removed:
        _quiet(state, existing)  # then a new incarnation: a new rig under the old name, with fresh state
    elif existing is not None:
        if _same_config(existing, wanted):
            return Accepted(result=_added(cmd.name, existing, changed=False))
        raise CommandError(
            "conflict",
            f"rig {cmd.name} exists with a different configuration (repo {existing.repo}, base "
            f"{existing.base_branch}); change its agent, gates and limits with `gt rig update {cmd.name}`, or add "
            "a rig under a new name for another repository, base branch or prefix",
        )
    if not (cmd.repo.startswith("/") or "://" in cmd.repo or cmd.repo.startswith("git@")):
        raise CommandError(
            "invalid", f"`repo` {cmd.repo[:200]!r} must be an absolute path or a URL (the witness runs elsewhere)"
        )
    taken = next(
        (r.name for r in state.rigs.values() if r.name != cmd.name and wanted.prefix in (r.prefix, *r.former_prefixes)),
        None,
    )
    if taken is not None:
        raise CommandError("conflict", f"bead prefix {wanted.prefix!r} is rig {taken}'s; give this rig `prefix`")
    facts = ctx.facts
    if isinstance(facts, RepoFacts) and facts.problem is not None:
        raise CommandError("not_found", facts.problem)
    return Accepted(
        events=[NewEvent(payload=wanted, expected_seq=existing.version if existing is not None else 0)],
        result=_added(
            cmd.name, wanted, changed=True, incarnation=UNSET if existing is None else existing.incarnation + 1
        ),
    )


def _live_rig(state: WitnessState, name: str) -> Rig:
    rig = state.rigs.get(name)
    if rig is None:
        known = ", ".join(sorted(r.name for r in state.rigs.values() if not r.removed)) or "none yet"
        raise CommandError("not_found", f"no rig {name!r} (rigs: {known})")
    if rig.removed:
        raise CommandError("not_found", f"rig {name!r} was removed")
    return rig


def _rig_result(rig: Rig, status: str, *, changed: bool, **extra: Any) -> RigResult:
    return RigResult(id=rig.name, rig=rig.name, status=status, changed=changed, **extra)


def _changed(rig: Rig, cmd: cmds.RigUpdate, field: str) -> Any:
    """The command's new value of ``field``, or UNSET when it is not given or already the rig's."""
    value = getattr(cmd, field)
    return msgspec.UNSET if value is None or value == getattr(rig, field) else value


def rig_update(state: WitnessState, cmd: cmds.RigUpdate) -> Accepted[RigResult]:
    """Only what changes goes in ``rig.updated``: the same update twice changes nothing the second time."""
    rig = _live_rig(state, cmd.name)
    event = RigUpdated(rig=rig.name, **{field: _changed(rig, cmd, field) for field in cmds.RigUpdate.SETTINGS})
    changed = {f: v for f in cmds.RigUpdate.SETTINGS if (v := getattr(event, f)) is not msgspec.UNSET}
    if not changed:
        return Accepted(result=_rig_result(rig, "unchanged", changed=False, fields=[]))
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=rig.version)],
        result=_rig_result(rig, "updated", changed=True, fields=sorted(changed), **changed),
    )


def rig_park(state: WitnessState, cmd: cmds.RigPark) -> Accepted[RigResult]:
    rig = _live_rig(state, cmd.name)
    if rig.parked:
        return Accepted(result=_rig_result(rig, "parked", changed=False, waiting=waiting_beads(state, rig.name)))
    event = NewEvent(payload=RigParked(rig=rig.name, reason=cmd.reason), expected_seq=rig.version)
    return Accepted(
        events=[event], result=_rig_result(rig, "parked", changed=True, waiting=waiting_beads(state, rig.name))
    )


def rig_unpark(state: WitnessState, cmd: cmds.RigUnpark) -> Accepted[RigResult]:
    rig = _live_rig(state, cmd.name)
    waiting = waiting_beads(state, rig.name)
    if not rig.parked:
        return Accepted(result=_rig_result(rig, "active", changed=False, waiting=waiting))
    event = NewEvent(payload=RigUnparked(rig=rig.name), expected_seq=rig.version)
    return Accepted(events=[event], result=_rig_result(rig, "active", changed=True, waiting=waiting))


def hooked_beads(state: WitnessState, rig: str) -> list[str]:
    """The beads hooked (or in progress) on ``rig``, in the order they were slung."""
    found = [b for b in state.beads.values() if b.rig == rig and b.status in WORKING]
    return [b.id for b in sorted(found, key=lambda b: b.slung_seq)]


def waiting_beads(state: WitnessState, rig: str) -> int:
    """Beads hooked on ``rig`` that no session works and no merge request carries: they wait for a polecat."""
    return sum(
        1
        for b in state.beads.values()
        if b.rig == rig
        and b.status in WORKING
        and not b.merge_requested
        and not any(state.sessions[s].status in ACTIVE_SESSION for s in b.sessions if s in state.sessions)
    )


def rig_remove(state: WitnessState, cmd: cmds.RigRemove) -> Accepted[RigResult]:
    """Refused while beads are hooked on the rig, unless forced: then it is parked for good (running sessions
    finish, the refinery still merges what is queued) and hidden; the hooked beads stay hooked until unslung."""
    rig = state.rigs.get(cmd.name)
    if rig is not None and rig.removed:
        return Accepted(result=_rig_result(rig, "removed", changed=False, hooked=[]))
    rig = _live_rig(state, cmd.name)
    hooked = hooked_beads(state, rig.name)
    if hooked and not cmd.force:
        shown = ", ".join(hooked[:20]) + (f" and {len(hooked) - 20} more" if len(hooked) > 20 else "")
        raise CommandError(
            "conflict",
            f"rig {rig.name} has work hooked: {shown}; unsling it (`gt unsling BEAD`) or re-sling it to another "
            f"rig (`gt sling BEAD RIG --force`) first, or remove the rig with --force (then it is parked for good: "
            "running sessions finish, the other beads stay hooked until unslung)",
        )
    event = NewEvent(payload=RigRemoved(rig=rig.name, hooked=hooked), expected_seq=rig.version)
    return Accepted(events=[event], result=_rig_result(rig, "removed", changed=True, hooked=hooked))


# ---- sessions (the agent's side) ---------------------------------------------------------------


def _session(state: WitnessState, session_id: str) -> Session:
    session = state.sessions.get(session_id)
    if session is None:
        raise CommandError("not_found", f"no session {session_id!r} (`gt session list` shows them)")
    return session


def _result(session: Session, status: str, *, changed: bool) -> SessionResult:
    return SessionResult(id=session.id, status=status, changed=changed, bead=session.bead, polecat=session.polecat)


def _ended_elsewhere(state: WitnessState, session: Session) -> CommandError:
    later = [s for s in state.beads[session.bead].sessions if s != session.id] if session.bead in state.beads else []
    where = f"; bead {session.bead} continues in session {later[-1]}" if later else ""
    return CommandError("conflict", f"session {session.id} already ended ({session.end_reason}){where}")


def done_intent(state: WitnessState, cmd: cmds.SessionDoneIntentCmd) -> Accepted[SessionResult]:
    session = _session(state, cmd.session)
    if session.status == "ended":
        if session.end_reason == "done":
            return Accepted(result=_result(session, "ended", changed=False))
        raise _ended_elsewhere(state, session)
    if session.done_intent_at is not None:
        return Accepted(result=_result(session, "finishing", changed=False))
    bead = state.beads.get(session.bead)
    if bead is not None and bead.gates.closed:
        # Handing in the work would take it past a gate not opened (the refinery refuses its merge request too).
        raise CommandError("gate_closed", gates.closed_gates_text(bead.id, bead.gates))
    event = NewEvent(payload=SessionDoneIntent(session_id=session.id), expected_seq=session.version)
    return Accepted(events=[event], result=_result(session, "finishing", changed=True))


def finish(state: WitnessState, cmd: cmds.SessionFinish) -> Accepted[SessionResult]:
    session = _session(state, cmd.session)
    if session.status == "ended":
        if session.end_reason == "done":
            return Accepted(result=_result(session, "ended", changed=False))
        raise _ended_elsewhere(state, session)
    if session.done_intent_at is None:
        raise CommandError("invalid", f"session {session.id} has no done-intent: `gt done` records it before finishing")
    event = NewEvent(payload=SessionEnded(session_id=session.id, reason="done"), expected_seq=session.version)
    return Accepted(events=[event], result=_result(session, "ended", changed=True))


def handoff(state: WitnessState, cmd: cmds.SessionHandoff) -> Accepted[SessionResult]:
    session = _session(state, cmd.session)
    if session.status not in ACTIVE_SESSION:
        if session.end_reason == "handoff":
            return Accepted(result=_result(session, "ended", changed=False))
        raise _ended_elsewhere(state, session)
    if session.done_intent_at is not None:
        raise CommandError("conflict", f"session {session.id} is finishing (`gt done` began); it cannot hand off")
    event = NewEvent(
        payload=SessionEnded(session_id=session.id, reason="handoff", detail=cmd.note), expected_seq=session.version
    )
    return Accepted(events=[event], result=_result(session, "ended", changed=True))


def stop(state: WitnessState, cmd: cmds.SessionStop) -> Accepted[SessionResult]:
    """A warrant with reason ``stopped``: the witness kills the agent (re-verified) and records the end."""
    session = _session(state, cmd.session)
    if session.status not in ACTIVE_SESSION:
        return Accepted(result=_result(session, "ended", changed=False))
    if session.warrant_reason is not None:
        return Accepted(result=_result(session, "stopping", changed=False))
    event = SessionWarranted(session_id=session.id, reason="stopped", detail="stopped by the operator")
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=session.version)],
        result=_result(session, "stopping", changed=True),
    )


# ---- nudges ------------------------------------------------------------------------------------


def _known_polecats(state: WitnessState, rig: str) -> list[str]:
    return sorted({s.polecat for s in state.sessions.values() if s.rig == rig})


def nudge(state: WitnessState, cmd: cmds.NudgeSend, ctx: DecideContext) -> Accepted[NudgeResult]:
    session_id: str | None = None
    bead: str | None = None
    target = state.sessions.get(cmd.target)
    if target is not None:
        rig, polecat, session_id, bead = target.rig, target.polecat, target.id, target.bead
    elif (match := cmds.POLECAT_TARGET.fullmatch(cmd.target)) is not None:
        rig, polecat = match["rig"], match["polecat"]
        if rig not in state.rigs:
            raise CommandError("not_found", f"no rig {rig!r} (`gt rig list` shows them)")
        known = _known_polecats(state, rig)
        if polecat not in known:
            listed = ", ".join(known) or "none yet"
            raise CommandError("not_found", f"rig {rig} has no polecat {polecat!r} (its polecats: {listed})")
        # About the work it has now: never typed into a session of the next bead it is given.
        working = [s for s in state.sessions.values() if (s.rig, s.polecat) == (rig, polecat)]
        active = [s for s in working if s.status in ACTIVE_SESSION]
        bead = active[-1].bead if active else None
    else:
        raise CommandError(
            "not_found",
            f"no session or polecat {cmd.target[:130]!r}: a target is a session id (`gt session list`) "
            "or <rig>/<polecat>",
        )
    nudge_id = ctx.new_id(NUDGE_PREFIX)
    expires_at = ctx.now + timedelta(seconds=cmd.ttl_s)
    message = cmd.message
    if ctx.actor.startswith(TOWN_AGENT_PREFIX):
        # Typed into a pane as it is, an agent's words would read as the operator's.
        message = f"[gastown nudge from {ctx.actor}, an agent, not your operator] {message}"
    event = NudgeQueued(
        nudge_id=nudge_id,
        rig=rig,
        polecat=polecat,
        session=session_id,
        bead=bead,
        message=message,
        expires_at=expires_at,
    )
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=0)],
        result=NudgeResult(
            id=nudge_id,
            status="queued",
            changed=True,
            rig=rig,
            polecat=polecat,
            session=session_id,
            expires_at=expires_at.isoformat(),
            live=_running(state, rig, polecat, session_id),
        ),
    )


def _running(state: WitnessState, rig: str, polecat: str, session_id: str | None) -> bool:
    """Whether the nudge's target runs now, so the witness types it in at once (else it waits in the queue)."""
    if session_id is not None:
        return state.sessions[session_id].status == "started"
    return any(s.status == "started" for s in state.sessions.values() if (s.rig, s.polecat) == (rig, polecat))


# ---- stale hooks (from the deacon) -------------------------------------------------------------


def _not_stale(bead: str, why: str) -> Accepted[StaleHookResult]:
    return Accepted(result=StaleHookResult(id=bead, status="not_stale", changed=False, why=why))


def last_session_of(state: WitnessState, bead_id: str) -> Session | None:
    bead = state.beads.get(bead_id)
    if bead is None:
        return None
    found = [state.sessions[s] for s in bead.sessions if s in state.sessions]
    return found[-1] if found else None


def recover_hook(state: WitnessState, cmd: cmds.SessionRecoverHook, ctx: DecideContext) -> Accepted[StaleHookResult]:
    """A stale hook is re-slung when its last worktree is clean, escalated otherwise; never dropped."""
    bead = state.beads.get(cmd.bead)
    if bead is None:
        raise CommandError("not_found", f"the witness knows no bead {cmd.bead!r} slung to one of its rigs")
    if bead.status not in WORKING:
        return _not_stale(bead.id, f"bead {bead.id} is {bead.status}")
    sessions = [state.sessions[s] for s in bead.sessions if s in state.sessions]
    active = next((s for s in sessions if s.status in ACTIVE_SESSION), None)
    if active is not None:
        return _not_stale(bead.id, f"session {active.id} works it")
    rig = state.rigs.get(bead.rig or "")
    if rig is not None and rig.parked:
        return _not_stale(bead.id, f"its rig {rig.name} is parked: it waits for `gt rig unpark {rig.name}`")
    hook = state.hooks.get(hook_lease_name(bead.id))
    if hook is not None and (hook.token > cmd.token or hook.status == "held"):
        return _not_stale(bead.id, f"its hook lease is at token {hook.token} ({hook.status})")
    if bead.merge_requested:
        return _not_stale(bead.id, "its merge request is in the queue")
    if bead.resling_owed:
        return _not_stale(bead.id, "a re-sling is already under way")
    last = sessions[-1] if sessions else None
    if last is None:
        return _not_stale(bead.id, "it never had a session: it waits for one")
    if last.escalated is not None or last.hook_recovery is not None:
        return _not_stale(bead.id, f"already {'escalated' if last.escalated else 'recovered'} after {last.id}")
    facts = ctx.facts
    at_risk = facts.at_risk if isinstance(facts, WorktreeFacts) else None
    if at_risk is not None:
        resolution = "escalate"
        detail = (
            f"bead {bead.id} ({bead.title}) has a stale hook (session {last.id} ended {last.end_reason}; its lease "
            f"lapsed) and its worktree {last.worktree} holds {at_risk}: recover that work, then re-sling the bead "
            f"with `gt sling {bead.id} {bead.rig} --force`, or close it"
        )
    elif bead.merge_rejected:
        resolution = "escalate"
        detail = (
            f"bead {bead.id} ({bead.title}) is still hooked but its merge request was rejected and nobody works it: "
            f"re-sling it with `gt sling {bead.id} {bead.rig} --force` for more work, or close it"
        )
    elif bead.stale_recoveries >= 1:
        resolution = "escalate"
        detail = (
            f"bead {bead.id} ({bead.title}) went stale again after a re-sling (last session {last.id} ended "
            f"{last.end_reason}): look at it, then re-sling it with `gt sling {bead.id} {bead.rig} --force` or close it"
        )
    else:
        resolution = "resling"
        detail = f"stale hook after session {last.id} ({last.end_reason}); worktree clean: re-slung"
    event = SessionHookRecovered(
        session_id=last.id, bead=bead.id, token=cmd.token, resolution=resolution, detail=detail
    )
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=last.version)],
        result=StaleHookResult(id=bead.id, status=resolution, changed=True, session=last.id, detail=detail),
    )


# ---- crew (docs/crew.md) ----------------------------------------------------------------------


def crew_add(state: WitnessState, cmd: cmds.CrewAdd, ctx: DecideContext) -> Accepted[CrewResult]:
    rig = _rig_in_service(state, cmd.rig)
    crew = state.crews.get(crew_key(cmd.rig, cmd.name))
    if crew is not None and crew.status == "added":
        return Accepted(events=[], result=_crew_result(crew, changed=False))
    if cmd.name in POOL or POOLED_NAME.fullmatch(cmd.name):
        raise CommandError(
            "invalid",
            f"{cmd.name!r} is a polecat's name (the witness names polecats {POOL[0]}, {POOL[1]}, ... p26, p27, ...): "
            "give the crew member another",
        )
    facts = ctx.facts
    if not isinstance(facts, CrewFacts):
        raise CommandError("unavailable", "the crew member's workspace could not be placed; send it again")
    event = CrewAdded(rig=rig.name, name=cmd.name, branch=crew_branch(cmd.name), workspace=facts.workspace)
    added = Crew(rig=rig.name, name=cmd.name, branch=event.branch, workspace=facts.workspace)
    if crew is not None and not crew.gone:  # removed, its workspace kept: used again
        added.workspace = crew.workspace
        event = msgspec.structs.replace(event, workspace=crew.workspace)
    version = crew.version if crew is not None else 0
    return Accepted(events=[NewEvent(payload=event, expected_seq=version)], result=_crew_result(added))


def crew_hook(state: WitnessState, cmd: cmds.CrewHook) -> Accepted[CrewResult]:
    crew = _crew_of(state, cmd)
    bead = state.beads.get(cmd.bead)
    if bead is None:
        raise CommandError("not_found", f"no bead {cmd.bead!r} (`gt bead list` shows them)")
    if crew.hooked == bead.id:
        return Accepted(events=[], result=_crew_result(crew, changed=False))
    if bead.status == "closed":
        raise CommandError("backward_transition", f"bead {bead.id} is closed: there is no work to hook")
    if crew.hooked is not None and _open(state, crew.hooked):
        raise CommandError(
            "conflict", f"crew member {cmd.rig}/{cmd.name} has bead {crew.hooked} hooked, open: one bead at a time"
        )
    other = crew_of_bead(state, bead.id)
    if other is not None:
        raise CommandError("conflict", f"bead {bead.id} is hooked to crew member {other.rig}/{other.name}")
    if bead.sessions or (bead.rig is not None and bead.rig != cmd.rig):
        where = f"worked by polecat sessions ({bead.sessions[-1]})" if bead.sessions else f"slung to rig {bead.rig}"
        raise CommandError("conflict", f"bead {bead.id} is {where}: hook a bead before it is slung")
    event = CrewHooked(rig=crew.rig, name=crew.name, bead=bead.id)
    hooked = msgspec.structs.replace(crew, hooked=bead.id)
    return Accepted(events=[NewEvent(payload=event, expected_seq=crew.version)], result=_crew_result(hooked))


def crew_remove(state: WitnessState, cmd: cmds.CrewRemove, ctx: DecideContext) -> Accepted[CrewResult]:
    crew = state.crews.get(crew_key(cmd.rig, cmd.name))
    if crew is None or crew.status == "removed":
        gone = crew or Crew(rig=cmd.rig, name=cmd.name, branch=crew_branch(cmd.name), workspace="", status="removed")
        if crew is None and cmd.rig not in state.rigs:
            raise CommandError("not_found", f"no rig {cmd.rig!r} (`gt rig list` shows them)")
        return Accepted(events=[], result=_crew_result(gone, changed=False))
    if crew.hooked is not None and _open(state, crew.hooked):
        raise CommandError(
            "conflict",
            f"bead {crew.hooked} is hooked to {cmd.rig}/{cmd.name} and open: close it or let it merge first",
        )
    working = [s.id for s in state.sessions.values() if s.worktree == crew.workspace and s.status in ACTIVE_SESSION]
    if working:
        raise CommandError("conflict", f"session {working[0]} works in {crew.workspace}: let it end first")
    at_risk = ctx.facts.at_risk if isinstance(ctx.facts, CrewFacts) else None
    if at_risk is not None:
        raise CommandError(
            "conflict",
            f"the workspace {crew.workspace} holds {at_risk}: commit and submit it (`gt done` there), or discard "
            "it, then remove the crew member",
        )
    removed = msgspec.structs.replace(crew, status="removed")
    event = CrewRemoved(rig=crew.rig, name=crew.name)
    return Accepted(events=[NewEvent(payload=event, expected_seq=crew.version)], result=_crew_result(removed))


def _crew_of(state: WitnessState, cmd: cmds.CrewHook) -> Crew:
    crew = state.crews.get(crew_key(cmd.rig, cmd.name))
    if crew is None or crew.status != "added":
        raise CommandError("not_found", f"no crew member {cmd.rig}/{cmd.name} (`gt crew list` shows them)")
    return crew


def _open(state: WitnessState, bead: str) -> bool:
    known = state.beads.get(bead)
    return known is not None and known.status != "closed"


def _rig_in_service(state: WitnessState, name: str) -> Rig:
    rig = state.rigs.get(name)
    if rig is None or rig.removed:
        raise CommandError("not_found", f"no rig {name!r} (`gt rig list` shows them)")
    return rig


def _crew_result(crew: Crew, *, changed: bool = True) -> CrewResult:
    return CrewResult(
        id=crew_key(crew.rig, crew.name),
        status=crew.status,
        changed=changed,
        rig=crew.rig,
        name=crew.name,
        branch=crew.branch,
        workspace=crew.workspace or UNSET,
        hooked=crew.hooked,
    )


# ---- town agents (docs/mayor-agent.md) ----------------------------------------------------------

DEFAULT_TOWN_AGENT_RUNTIME = "claude"
TOWN_AGENT_RUNTIMES = tuple(name for name, make in RUNTIMES.items() if make().transcript_files)
"""The runtimes a town agent may run: those whose transcript the witness reads its answers from."""
ASK_PREFIX = "ask"


def town_agent_start(state: WitnessState, cmd: cmds.TownAgentStart, ctx: DecideContext) -> Accepted[TownAgentResult]:
    agent = state.town_agents.get(cmd.name)
    if agent is not None and agent.wanted:
        return Accepted(events=[], result=_town_agent_result(agent, changed=False))
    if isinstance(ctx.facts, TownAgentFacts) and ctx.facts.problem is not None:
        raise CommandError("invalid", ctx.facts.problem)
    runtime = cmd.agent.strip() or DEFAULT_TOWN_AGENT_RUNTIME
    if not runtime_for(runtime).transcript_files:
        raise CommandError(
            "invalid",
            f"{runtime[:80]!r} keeps no transcript the witness can read the agent's answers from; a town agent runs "
            f"one of: {', '.join(TOWN_AGENT_RUNTIMES)}",
        )
    event = TownAgentStarted(name=cmd.name, agent=runtime)
    version = agent.version if agent is not None else 0
    started = TownAgent(name=cmd.name, agent=runtime)
    return Accepted(events=[NewEvent(payload=event, expected_seq=version)], result=_town_agent_result(started))


def town_agent_stop(state: WitnessState, cmd: cmds.TownAgentStop) -> Accepted[TownAgentResult]:
    agent = state.town_agents.get(cmd.name)
    if agent is None or not agent.wanted:
        stopped = agent or TownAgent(name=cmd.name, agent="", wanted=False)
        return Accepted(events=[], result=_town_agent_result(stopped, changed=False, wanted=False))
    event = TownAgentStopped(name=cmd.name)
    result = _town_agent_result(agent, wanted=False)
    return Accepted(events=[NewEvent(payload=event, expected_seq=agent.version)], result=result)


def town_agent_ask(state: WitnessState, cmd: cmds.TownAgentAsk, ctx: DecideContext) -> Accepted[TownAgentResult]:
    agent = state.town_agents.get(cmd.name)
    if agent is None or not agent.wanted:
        raise CommandError("conflict", f"the {cmd.name} agent is not running: start it first (`gt mayor start`)")
    ask_id = ctx.new_id(ASK_PREFIX)
    event = TownAgentAsked(name=cmd.name, ask_id=ask_id, text=cmd.text, asked_by=ctx.actor)
    result = _town_agent_result(agent)
    result.ask_id = ask_id
    return Accepted(events=[NewEvent(payload=event, expected_seq=agent.version)], result=result)


def _town_agent_result(agent: TownAgent, *, changed: bool = True, wanted: bool | None = None) -> TownAgentResult:
    running = agent.wanted if wanted is None else wanted
    return TownAgentResult(
        id=agent.name, status="running" if running else "stopped", changed=changed, agent=agent.agent or UNSET
    )
