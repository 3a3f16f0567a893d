"""Decisions on escalations: raise, acknowledge, close. Re-escalation is owed by ``plan``. Pure."""

from __future__ import annotations

from services.mayor.decide.beads import fresh_id, get_bead
from services.mayor.state import Escalation, MayorState
from shared.core.errors import CommandError
from shared.core.ids import ESCALATION_PREFIX
from shared.model.commands import EscalationAck, EscalationClose, EscalationRaise
from shared.model.commands.actors import TOWN_AGENT_PREFIX
from shared.model.decision import Accepted, DecideContext, NewEvent
from shared.model.events import EscalationAcked, EscalationClosed, EscalationRaised
from shared.model.results import EscalationResult


def get_escalation(state: MayorState, escalation_id: str) -> Escalation:
    escalation = state.escalations.get(escalation_id)
    if escalation is None:
        raise CommandError("not_found", f"no escalation {escalation_id!r}")
    return escalation


def raise_(state: MayorState, cmd: EscalationRaise, ctx: DecideContext) -> Accepted[EscalationResult]:
    if cmd.bead is not None:
        get_bead(state, cmd.bead, field="bead")
    escalation_id = fresh_id(ctx, ESCALATION_PREFIX, state.escalations, cmd.new_id)
    event = EscalationRaised(
        escalation_id=escalation_id,
        severity=cmd.severity,
        # A polecat or the mayor agent raises as itself: its actor comes from the subject it may publish on, its body
        # is its own (it may not say the witness or an operator raised it).
        source=ctx.actor if ctx.actor.startswith(("polecat:", TOWN_AGENT_PREFIX)) else (cmd.source or ctx.actor),
        message=cmd.message,
        bead=cmd.bead,
        resolved_when=list(cmd.resolved_when),
    )
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=0)],
        result=EscalationResult(id=escalation_id, severity=cmd.severity, status="open", changed=True),
    )


def ack(state: MayorState, cmd: EscalationAck, ctx: DecideContext) -> Accepted[EscalationResult]:
    escalation = get_escalation(state, cmd.id)
    if escalation.status == "closed":
        raise CommandError("backward_transition", f"escalation {escalation.id} is closed; raise a new one")
    if escalation.status == "acked":
        return Accepted(result=EscalationResult(id=escalation.id, status="acked", changed=False))
    event = EscalationAcked(escalation_id=escalation.id, by=ctx.actor)
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=escalation.version)],
        result=EscalationResult(id=escalation.id, status="acked", changed=True),
    )


def close(state: MayorState, cmd: EscalationClose, ctx: DecideContext) -> Accepted[EscalationResult]:
    escalation = get_escalation(state, cmd.id)
    if escalation.status == "closed":
        return Accepted(result=EscalationResult(id=escalation.id, status="closed", changed=False))
    event = EscalationClosed(escalation_id=escalation.id, by=ctx.actor, reason=cmd.reason)
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=escalation.version)],
        result=EscalationResult(id=escalation.id, status="closed", changed=True),
    )
