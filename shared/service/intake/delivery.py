"""One delivery of a stored command: its subject parsed, its body peeked, and who sent it decided, before anything
reads what it says."""

from __future__ import annotations

from datetime import datetime

from shared.bus import consumer as bus_consumer
from shared.bus.consumer import Message
from shared.core import ids, subjects
from shared.core.errors import CommandError
from shared.model.commands import peek_body_fields
from shared.service.intake.identity import OPERATOR, Sender, command_actor


class Delivery:
    """One delivery of a stored command: fetched from the consumer (``msg`` set, acked once settled), or read
    from the stream because a dead predecessor held it (``msg`` None: its redelivery is acked later)."""

    __slots__ = (
        "actor",
        "actor_class",
        "body",
        "command_id",
        "command_subject",
        "correlation_id",
        "delivered",
        "held",
        "msg",
        "name",
        "origin",
        "refusal",
        "stored_at",
        "stream_seq",
        "subject",
    )

    def __init__(
        self,
        *,
        subject: str,
        body: bytes,
        headers: dict[str, str] | None,
        stream_seq: int,
        delivered: int,
        max_bytes: int,
        origin_from: int = 0,
        msg: Message | None = None,
        stored_at: datetime | None = None,
    ) -> None:
        self.msg = msg
        self.subject = subject
        self.stream_seq, self.delivered = stream_seq, delivered
        self.held = msg is None
        self.stored_at = stored_at
        self.body = body
        header_id = (headers or {}).get("Nats-Msg-Id")
        if len(self.body) <= max_bytes:
            body_id, actor, correlation = peek_body_fields(self.body)
        else:
            body_id = actor = correlation = None
        self.command_subject, self.origin = subjects.split_origin(subject)
        """The command's own subject (``gt.cmd.step.done``), and who sent it when it came on a session's or a
        service's own subject."""
        self.command_id = ids.command_id(header_id, body_id, self.stream_seq)
        if (scope := subjects.id_scope(self.origin)) is not None:
            self.command_id = ids.session_scoped_id(scope, self.command_id)
        before_cutover = self.origin is None and self.stream_seq < origin_from
        sender = command_actor(actor, self.origin, before_cutover=before_cutover, command=self.command_subject)
        self.refusal: CommandError | None = None
        """The ``unauthorized`` answer of a body naming someone its sender may not act as."""
        if isinstance(sender, CommandError):
            self.refusal = sender
            # Charged as whom the subject says it is from: an operator cannot spend a service's limits.
            sender = (
                Sender(
                    self.origin.actor, "operator" if isinstance(self.origin, subjects.TownAgentOrigin) else "service"
                )
                if self.origin is not None
                else Sender(OPERATOR, "operator")
            )
        self.actor, self.actor_class = sender
        self.correlation_id = correlation or self.command_id
        self.name = self.command_subject.removeprefix(subjects.CMD_PREFIX + ".")

    @classmethod
    def fetched(cls, msg: Message, max_bytes: int, origin_from: int) -> Delivery:
        info = subjects.parse_js_reply(msg.reply)
        return cls(
            subject=msg.subject,
            body=msg.data,
            headers=msg.headers,
            stream_seq=info.stream_seq,
            delivered=info.delivered,
            max_bytes=max_bytes,
            origin_from=origin_from,
            msg=msg,
        )

    @classmethod
    def held_by_predecessor(cls, msg: Message, max_bytes: int, origin_from: int) -> Delivery:
        """A command read from the stream (not delivered by the durable consumer): nothing to ack."""
        stored = bus_consumer.stored(msg)
        return cls(
            subject=msg.subject,
            body=msg.data,
            headers=msg.headers,
            stream_seq=stored.seq,
            delivered=0,
            max_bytes=max_bytes,
            origin_from=origin_from,
            stored_at=stored.stored_at,
        )

    def stored_time(self) -> datetime:
        if self.stored_at is not None:
            return self.stored_at
        assert self.msg is not None
        return bus_consumer.stored_at(self.msg)
