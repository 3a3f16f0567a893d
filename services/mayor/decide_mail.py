"""Decisions on mail: messages are beads of type ``message`` addressed by their assignee. Pure."""

from __future__ import annotations

from services.mayor.decide_beads import fresh_id, get_bead
from services.mayor.reads import is_message, is_read
from services.mayor.state import MESSAGE_TYPE, READ_LABEL, Bead, MayorState
from shared.commands import MailArchive, MailRead, MailReply, MailSend
from shared.decision import Accepted, DecideContext, NewEvent
from shared.errors import CommandError
from shared.events import BeadClosed, BeadCreated, BeadUpdated

MAIL_PREFIX = "hq"
SUBJECT_FROM_BODY = 80
THREAD_LABEL = "thread:"


def get_message(state: MayorState, message_id: str) -> Bead:
    bead = get_bead(state, message_id)
    if not is_message(bead):
        raise CommandError("invalid", f"bead {message_id} is a {bead.type}, not a message")
    return bead


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
) -> tuple[str, NewEvent]:
    message_id = fresh_id(ctx, MAIL_PREFIX, state.beads)
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


def send(state: MayorState, cmd: MailSend, ctx: DecideContext) -> Accepted:
    message_id, event = _message(
        state,
        ctx,
        to=cmd.to,
        body=cmd.body,
        subject=cmd.subject,
        thread=cmd.thread,
        reply_to=None,
        priority=cmd.priority,
    )
    thread = cmd.thread or message_id
    return Accepted(events=[event], result={"id": message_id, "to": cmd.to, "thread": thread, "changed": True})


def reply(state: MayorState, cmd: MailReply, ctx: DecideContext) -> Accepted:
    original = get_message(state, cmd.id)
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
    )
    return Accepted(events=[event], result={"id": message_id, "to": sender, "thread": thread, "changed": True})


def read(state: MayorState, cmd: MailRead) -> Accepted:
    message = get_message(state, cmd.id)
    if is_read(message):
        return Accepted(result={"id": message.id, "read": True, "changed": False})
    event = BeadUpdated(bead_id=message.id, add_labels=[READ_LABEL])
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=message.version)],
        result={"id": message.id, "read": True, "changed": True},
    )


def archive(state: MayorState, cmd: MailArchive) -> Accepted:
    message = get_message(state, cmd.id)
    if message.status == "closed":
        return Accepted(result={"id": message.id, "status": "closed", "changed": False})
    event = BeadClosed(bead_id=message.id, reason="archived")
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=message.version)],
        result={"id": message.id, "status": "closed", "changed": True},
    )
