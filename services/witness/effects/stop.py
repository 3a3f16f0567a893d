"""Stopping a session: its warrant (recorded first, with what its pane showed), the kill (re-verified right before
the signal), its end; the escalations a stop owes (a blocked screen, refused credentials that park the rig, a
bead given up on, a rig whose sessions die together); tmux sessions nobody owns."""

from __future__ import annotations

import asyncio
import time

import structlog

from services.witness import plan as planning
from services.witness.effects.done import DoneFinisher
from services.witness.effects.toolkit import Toolkit
from services.witness.plan.actions import Escalate, Kill, KillOrphan, MassDeath, Warrant
from services.witness.state import Session
from shared.core.faults import crash_point
from shared.model.commands import EscalationRaise
from shared.model.decision import NewEvent
from shared.model.events import RigMassDeath, RigParked, SessionEscalated, SessionWarranted

log = structlog.get_logger(__name__)

BLOCKED_SCREEN_CHARS = 1500
"""How much of a blocked pane's text an escalation carries."""


class Stopper:
    def __init__(self, kit: Toolkit, done: DoneFinisher) -> None:
        self.kit = kit
        self.done = done

    async def warrant(self, action: Warrant) -> None:
        session = self.kit.session(action.session)
        if session is None or session.status == "ended" or session.warrant_reason is not None:
            return
        # The version the warrant is decided on, read before any await: ``session`` is the projection's live
        # record, and a session.ended applied while the pane is read must make this append conflict.
        decided_on = session.version
        if action.reason == planning.AGENT_UNAUTHORIZED:
            await self._park_refused(session, action.detail)
            session = self.kit.session(action.session) or session
            decided_on = session.version
        tail = await asyncio.to_thread(self.kit.pane_tail, session)
        if action.escalate:
            await self._escalate_blocked(session, action.detail, tail)
            session = self.kit.session(action.session) or session
            decided_on = session.version
        event = SessionWarranted(session_id=session.id, reason=action.reason, detail=action.detail, pane_tail=tail)
        if not await self.kit.append(NewEvent(payload=event, expected_seq=decided_on)):
            return
        # The pane's last lines in the log as well: why an agent died is read there first (a traceback, an error).
        log.info(
            "session_warranted", session=session.id, reason=action.reason, detail=action.detail, pane_tail=tail[-2000:]
        )
        crash_point("witness.after_warrant")
        await self.kill(Kill(session=session.id))

    async def _escalate_blocked(self, session: Session, detail: str, tail: str) -> None:
        """The agent waits at a screen before it started: tell the operator at once what the pane shows, and mark
        the session escalated before it is ended, so no fresh session is started into the same screen."""
        rig = self.kit.host.state.rigs.get(session.rig)
        shown = tail[-BLOCKED_SCREEN_CHARS:] or "(the pane showed nothing)"
        message = (
            f"{detail}. Nobody answers it there, so session {session.id} is ended (failed_to_start) and bead "
            f"{session.bead} is not respawned into the same screen; it waits on its hook with its worktree. Its pane "
            f"showed:\n{shown}\nAnswer it for the agent's config home (docs/agents.md, Claude Code), then "
            f"`gt sling {session.bead} {rig.name if rig else session.rig} --force`."
        )
        log.warning("agent_blocked_at_screen", session=session.id, rig=session.rig, detail=detail)
        await self.kit.raise_escalation(session, message)
        if session.escalated is None:
            escalated = SessionEscalated(session_id=session.id, reason="agent_blocked")
            await self.kit.append(NewEvent(payload=escalated, expected_seq=session.version))

    async def _park_refused(self, session: Session, detail: str) -> None:
        """The model API refused the agent's credentials: every new session of the rig would be refused too. Park
        the rig first (so no plan made after this session ends starts another), then tell the operator."""
        rig = self.kit.host.state.rigs.get(session.rig)
        if rig is None:
            return
        if not rig.parked:
            parked = RigParked(rig=rig.name, reason=f"agent credentials refused (session {session.id})")
            await self.kit.append(NewEvent(payload=parked, expected_seq=rig.version))
        message = (
            f"{detail}. Session {session.id} (bead {session.bead}, polecat {session.polecat}) is ended and rig "
            f"{rig.name} is parked: no new sessions until the credentials are fixed (the witness's "
            f"ANTHROPIC_API_KEY or the other settings of docs/agents.md), then `gt rig unpark {rig.name}`; the "
            "bead waits on its hook and goes on then."
        )
        log.warning("agent_unauthorized", session=session.id, rig=rig.name, detail=detail)
        await self.kit.raise_escalation(session, message)

    async def kill(self, action: Kill) -> None:
        session = self.kit.session(action.session)
        if session is None or session.status == "ended" or session.warrant_reason is None:
            return
        await asyncio.to_thread(self._verify_and_kill, session)
        crash_point("witness.after_kill")
        session = self.kit.session(action.session) or session
        reason = session.warrant_reason or "dead"
        if session.done_intent_at is not None:
            await self.done.finish(session, reason)
        elif reason == "bead_closed":
            await self.kit.end(session, "bead_closed", "its bead was closed")
        elif reason == "gate_wait":
            await self.kit.end(session, reason, session.warrant_detail)
        elif reason == "unslung":
            await self.kit.end(session, "unslung", "its bead was unslung by an operator")
        else:
            await self.kit.end(session, reason, "killed after warrant")

    def _verify_and_kill(self, session: Session) -> None:
        """Kill the session's agent and tmux session, each only if it is still the one we recorded."""
        if self.kit.stop_if_ours(session):
            log.info("session_killed", session=session.id, tmux=session.tmux_name)

    async def escalate(self, action: Escalate) -> None:
        session = self.kit.session(action.session)
        if session is None or session.escalated is not None:
            return
        await self.kit.raise_escalation(session, action.message)
        await self.kit.append(
            NewEvent(
                payload=SessionEscalated(session_id=session.id, reason=action.reason), expected_seq=session.version
            )
        )
        log.warning("bead_escalated", session=session.id, bead=session.bead, reason=action.reason)

    async def mass_death(self, action: MassDeath) -> None:
        rig = self.kit.host.state.rigs.get(action.rig)
        if rig is None:
            return
        died = [s for sid in action.sessions if (s := self.kit.session(sid)) is not None]
        beads = sorted({s.bead for s in died})
        # The newest death that left words: what an operator reads first to find the common cause.
        said = next((s for s in reversed(died) if s.pane_tail or s.end_detail), None)
        message = (
            f"mass death on rig {action.rig}: {len(action.sessions)} sessions of {len(beads)} beads died within "
            f"{action.window_s:g}s ({', '.join(action.sessions)}). Something common may be broken (agent "
            "command, credentials, disk, the machine)."
        ) + (f" {planning.last_words(said)}".rstrip() if said is not None else "")
        source = f"witness/{action.rig}"
        await self.kit.host.store(
            EscalationRaise(
                severity="critical",
                message=message,
                source=source,
                # A session of the rig that finishes its work shows that what they shared works again.
                resolved_when=[f"rig:{action.rig}"],
                cmd_id=f"massdeath-{action.sessions[0]}",
            )
        )
        event = RigMassDeath(rig=action.rig, sessions=list(action.sessions), window_s=action.window_s)
        await self.kit.append(NewEvent(payload=event, expected_seq=rig.version))
        log.warning("mass_death", rig=action.rig, sessions=list(action.sessions))

    async def kill_orphan(self, action: KillOrphan) -> None:
        await asyncio.to_thread(self._kill_orphan, action)

    def _kill_orphan(self, action: KillOrphan) -> None:
        # Re-check right before the kill: still there, still the same session, still nobody's, still old.
        pane = self.kit.tmux.snapshot().get(action.tmux_name)  # our town's sessions only
        if pane is None or pane.created != action.created or pane.pane_pid != action.pane_pid:
            return
        if not pane.town or not self.kit.tmux.ours(pane):
            return  # not marked as our town's: never an orphan of ours
        if pane.label in self.kit.host.state.sessions:
            return
        if time.time() - pane.created < self.kit.settings.min_orphan_age_s:
            return
        self.kit.tmux.kill(action.tmux_name)
        log.warning("orphan_tmux_session_killed", tmux=action.tmux_name, label=pane.label, pane_pid=pane.pane_pid)
