"""Routes a command to the module of its area: the mayor's ``decide``. Pure: no I/O, no clock."""

from __future__ import annotations

from services.mayor.decide import beads as decide_beads
from services.mayor.decide import convoys as decide_convoys
from services.mayor.decide import escalations as decide_escalations
from services.mayor.decide import mail as decide_mail
from services.mayor.decide import work as decide_work
from services.mayor.state import MayorState
from shared.core.errors import CommandError
from shared.model.commands import (
    BeadClaim,
    BeadClose,
    BeadCreate,
    BeadSling,
    BeadUnsling,
    BeadUpdate,
    Command,
    ConvoyAdd,
    ConvoyCreate,
    ConvoyLand,
    EscalationAck,
    EscalationClose,
    EscalationRaise,
    MailArchive,
    MailRead,
    MailReply,
    MailSend,
    StepDone,
    StepStart,
)
from shared.model.decision import Accepted, DecideContext


def decide(state: MayorState, cmd: Command, ctx: DecideContext) -> Accepted:
    """The events ``cmd`` produces on ``state``.

    Raises:
        CommandError: the command cannot be carried out (``not_found``, ``conflict``, ...).
    """
    match cmd:
        case BeadCreate():
            return decide_beads.create(state, cmd, ctx)
        case BeadUpdate():
            return decide_beads.update(state, cmd)
        case BeadClaim():
            return decide_beads.claim(state, decide_beads.get_bead(state, cmd.id), cmd.assignee)
        case BeadClose():
            return decide_beads.close(state, decide_beads.get_bead(state, cmd.id), cmd.reason)
        case BeadSling():
            return decide_work.sling(state, cmd, ctx)
        case BeadUnsling():
            return decide_work.unsling(state, cmd)
        case StepStart():
            return decide_work.step_start(state, cmd)
        case StepDone():
            return decide_work.step_done(state, cmd)
        case ConvoyCreate():
            return decide_convoys.create(state, cmd, ctx)
        case ConvoyAdd():
            return decide_convoys.add(state, cmd)
        case ConvoyLand():
            return decide_convoys.land(state, cmd)
        case MailSend():
            return decide_mail.send(state, cmd, ctx)
        case MailReply():
            return decide_mail.reply(state, cmd, ctx)
        case MailRead():
            return decide_mail.read(state, cmd, ctx)
        case MailArchive():
            return decide_mail.archive(state, cmd, ctx)
        case EscalationRaise():
            return decide_escalations.raise_(state, cmd, ctx)
        case EscalationAck():
            return decide_escalations.ack(state, cmd, ctx)
        case EscalationClose():
            return decide_escalations.close(state, cmd, ctx)
    raise CommandError("unknown_command", f"the mayor does not handle {type(cmd).__name__}")
