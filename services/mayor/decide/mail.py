"""Decisions on mail: messages are beads of type ``message`` addressed by their assignee. Pure."""

from __future__ import annotations

from collections.abc import Collection

from services.mayor.decide.beads import fresh_id, get_bead
from services.mayor.state import MESSAGE_TYPE, READ_LABEL, Bead, MayorState, is_message, is_read
from shared.core.errors import CommandError
from shared.core.ids import MAIL_PREFIX
from shared.model.commands import MailArchive, MailRead, MailReply, MailSend
from shared.model.commands.actors import TOWN_AGENT_PREFIX
from shared.model.commands.mail import (
    ACCEPTED_ADDRESSES,
    OPERATOR_ADDRESS,
    POLECAT_ADDRESS,
    RIG_ADDRESS,
    normalise_address,
    polecat_address,
)
from shared.model.decision import Accepted, DecideContext, NewEvent
from shared.model.events import BeadClosed, BeadCreated, BeadUpdated
from shared.model.results import BeadResult, MailReadResult, MailResult

SUBJECT_FROM_BODY = 80
THREAD_LABEL = "thread:"


def get_message(state: MayorState, message_id: str) -> Bead:
    bead = get_bead(state, message_id)
    if not is_message(bead):
        raise CommandError("invalid", f"bead {message_id} is a {bead.type}, not a message")
    return bead


def own_message(state: MayorState, message_id: str, actor: str) -> Bead:
    """The message, when ``actor`` may act on it: a polecat only on mail in its own inbox (it cannot read, archive
    or answer another polecat's); operators and services on any."""
    message = get_message(state, message_id)
    if POLECAT_ADDRESS.fullmatch(actor) and message.assignee != actor:
        raise CommandError("unauthorized", f"message {message.id} is not in the inbox of {actor}")
    if actor.startswith(TOWN_AGENT_PREFIX) and message.assignee != actor.removeprefix(TOWN_AGENT_PREFIX):
        # The mayor agent's inbox is `mayor`'s: the operators' and the polecats' mail is theirs.
        raise CommandError("unauthorized", f"message {message.id} is not in the inbox of {actor}")
    return message


def _subject(subject: str, body: str) -> str:
    if subject.strip():
        return subject
    first_line = body.strip().splitlines()[0] if body.strip() else "(no subject)"
    return first_line[:SUBJECT_FROM_BODY]


def _message(
    state: MayorState,
    ctx: DecideContext,
    *,
    to: str,
    body: str,
    subject: str,
    thread: str | None,
    reply_to: str | None,
    priority: int,
    taken: Collection[str] | None = None,
    chosen: str | None = None,
) -> tuple[str, NewEvent]:
    message_id = fresh_id(ctx, MAIL_PREFIX, state.beads if taken is None else taken, chosen)
    thread_id = thread or message_id
    metadata = {"from": ctx.actor, "thread": thread_id}
    if reply_to:
        metadata["reply_to"] = reply_to
    event = BeadCreated(
        bead_id=message_id,
        title=_subject(subject, body),
        type=MESSAGE_TYPE,
        priority=priority,
        description=body,
        labels=[f"{THREAD_LABEL}{thread_id}"],
        metadata=metadata,
        assignee=to,
    )
    return message_id, NewEvent(payload=event, expected_seq=0)


def _no_rig(rig: str) -> CommandError:
    return CommandError(
        "not_found", f"no rig {rig!r} (`gt rig list` shows them); accepted addresses: {ACCEPTED_ADDRESSES}"
    )


def recipients(state: MayorState, to: str) -> tuple[str, list[str]]:
    """The address in its canonical form, and the inboxes a message to it goes to (a rig's: each polecat at
    work on it now).

    Raises:
        CommandError: ``invalid`` for what is no address, ``not_found`` for a rig or polecat the log does not know
            (or a rig with nobody at work to read it).
    """
    address = normalise_address(to)
    if address == "mayor" or OPERATOR_ADDRESS.fullmatch(address):
        return address, [address]
    if (polecat := POLECAT_ADDRESS.fullmatch(address)) is not None:
        rig = state.rigs.get(polecat["rig"])
        if rig is None:
            raise _no_rig(polecat["rig"])
        if polecat["polecat"] not in rig.polecats:
            known = ", ".join(sorted(rig.polecats)) or "none yet"
            raise CommandError(
                "not_found", f"rig {rig.name} has no polecat {polecat['polecat']!r} (its polecats: {known})"
            )
        return address, [address]
    if (named := RIG_ADDRESS.fullmatch(address)) is not None:
        rig = state.rigs.get(named["rig"])
        if rig is None:
            raise _no_rig(named["rig"])
        at_work = sorted(name for name, session in rig.polecats.items() if session is not None)
        if not at_work:
            raise CommandError(
                "not_found",
                f"no polecat is at work on rig {rig.name} now, so nobody would read it; write to one by name "
                f"(polecat:{rig.name}/<name>) or later",
            )
        return f"rig:{rig.name}", [polecat_address(rig.name, name) for name in at_work]
    raise CommandError("invalid", f"`to` {to[:80]!r} is no address; accepted addresses: {ACCEPTED_ADDRESSES}")


def send(state: MayorState, cmd: MailSend, ctx: DecideContext) -> Accepted[MailResult]:
    address, inboxes = recipients(state, cmd.to)
    events: list[NewEvent] = []
    ids: list[str] = []
    thread = cmd.thread
    taken = dict.fromkeys(state.beads)
    for inbox in inboxes:
        message_id, event = _message(
            state,
            ctx,
            to=inbox,
            body=cmd.body,
            subject=cmd.subject,
            thread=thread,
            reply_to=None,
            priority=cmd.priority,
            taken=taken,
            chosen=None if ids else cmd.new_id,  # the sender's id is the first copy's (and the thread's)
        )
        thread = thread or message_id  # a rig's copies share the first one's thread
        taken[message_id] = None
        events.append(event)
        ids.append(message_id)
    result = MailResult(id=ids[0], to=address, thread=thread, changed=True)
    if len(ids) > 1 or address.startswith("rig:"):
        result.ids = ids
        result.recipients = inboxes
    return Accepted(events=events, result=result)


def reply(state: MayorState, cmd: MailReply, ctx: DecideContext) -> Accepted[MailResult]:
    original = own_message(state, cmd.id, ctx.actor)
    sender = original.metadata.get("from")
    if not sender:
        raise CommandError("invalid", f"message {original.id} has no sender to reply to")
    thread = original.metadata.get("thread") or original.id
    subject = cmd.subject or (original.title if original.title.startswith("Re: ") else f"Re: {original.title}")
    message_id, event = _message(
        state,
        ctx,
        to=sender,
        body=cmd.body,
        subject=subject,
        thread=thread,
        reply_to=original.id,
        priority=original.priority,
        chosen=cmd.new_id,
    )
    return Accepted(events=[event], result=MailResult(id=message_id, to=sender, thread=thread, changed=True))


def reads_for_addressee(actor: str, addressee: str | None) -> bool:
    """Whether ``actor`` reading a message marks it read: only its addressee's reading does. The mayor's and the
    shared ``operator`` inbox are read by the operators, so any operator's reading counts there; an operator
    reading a polecat's (or another operator's) mail leaves it unread for them."""
    if actor == addressee or (addressee is not None and actor == TOWN_AGENT_PREFIX + addressee):
        return True  # the mayor agent (agent:mayor) reads the mayor's inbox
    return addressee in ("mayor", "operator") and OPERATOR_ADDRESS.fullmatch(actor) is not None


def read(state: MayorState, cmd: MailRead, ctx: DecideContext) -> Accepted[MailReadResult]:
    message = own_message(state, cmd.id, ctx.actor)
    if not reads_for_addressee(ctx.actor, message.assignee):
        return Accepted(
            result=MailReadResult(id=message.id, read=is_read(message), changed=False, left_unread_for=message.assignee)
        )
    if is_read(message):
        return Accepted(result=MailReadResult(id=message.id, read=True, changed=False))
    event = BeadUpdated(bead_id=message.id, add_labels=[READ_LABEL])
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=message.version)],
        result=MailReadResult(id=message.id, read=True, changed=True),
    )


def archive(state: MayorState, cmd: MailArchive, ctx: DecideContext) -> Accepted[BeadResult]:
    message = own_message(state, cmd.id, ctx.actor)
    if message.status == "closed":
        return Accepted(result=BeadResult(id=message.id, status="closed", changed=False))
    event = BeadClosed(bead_id=message.id, reason="archived")
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=message.version)],
        result=BeadResult(id=message.id, status="closed", changed=True),
    )
