"""Routes a command to the module of its area: the mayor's ``decide``. Pure: no I/O, no clock."""

from __future__ import annotations

from services.mayor.decide import beads as decide_beads
from services.mayor.decide import convoys as decide_convoys
from services.mayor.decide import escalations as decide_escalations
from services.mayor.decide import mail as decide_mail
from services.mayor.decide import work as decide_work
from services.mayor.state import MayorState
from shared.core.errors import CommandError
from shared.model import commands as cmds
from shared.model.decision import Accepted, DecideContext


def decide(state: MayorState, cmd: cmds.Command, ctx: DecideContext) -> Accepted:
    """The events ``cmd`` produces on ``state``.

    Raises:
        CommandError: the command cannot be carried out (``not_found``, ``conflict``, ...).
    """
    match cmd:
        case cmds.BeadCreate():
            return decide_beads.create(state, cmd, ctx)
        case cmds.BeadUpdate():
            return decide_beads.update(state, cmd)
        case cmds.BeadClaim():
            return decide_beads.claim(state, decide_beads.get_bead(state, cmd.id), cmd.assignee)
        case cmds.BeadClose():
            return decide_beads.close(state, decide_beads.get_bead(state, cmd.id), cmd.reason)
        case cmds.BeadSling():
            return decide_work.sling(state, cmd, ctx)
        case cmds.BeadUnsling():
            return decide_work.unsling(state, cmd)
        case cmds.StepStart():
            return decide_work.step_start(state, cmd)
        case cmds.StepDone():
            return decide_work.step_done(state, cmd)
        case cmds.GateApprove() | cmds.GateOpen():
            return decide_work.gate_open(state, cmd, ctx)
        case cmds.ConvoyCreate():
            return decide_convoys.create(state, cmd, ctx)
        case cmds.ConvoyAdd():
            return decide_convoys.add(state, cmd)
        case cmds.ConvoyLand():
            return decide_convoys.land(state, cmd)
        case cmds.MailSend():
            return decide_mail.send(state, cmd, ctx)
        case cmds.MailReply():
            return decide_mail.reply(state, cmd, ctx)
        case cmds.MailRead():
            return decide_mail.read(state, cmd, ctx)
        case cmds.MailArchive():
            return decide_mail.archive(state, cmd, ctx)
        case cmds.EscalationRaise():
            return decide_escalations.raise_(state, cmd, ctx)
        case cmds.EscalationAck():
            return decide_escalations.ack(state, cmd, ctx)
        case cmds.EscalationClose():
            return decide_escalations.close(state, cmd, ctx)
    raise CommandError("unknown_command", f"the mayor does not handle {type(cmd).__name__}")
