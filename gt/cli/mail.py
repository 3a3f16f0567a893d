"""`gt mail ...`, `gt escalate`, `gt escalations`, `gt escalation ack|close`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from gt.cli import client, identity, render
from gt.cli.common import (
    DEFAULT_COMMAND_TIMEOUT_S,
    EXIT_REJECTED,
    Subcommands,
    UsageError,
    limit_option,
    print_id,
    read,
    rejected_line,
    send,
    show,
    show_reply,
    status_line,
)
from shared.bus.query import reply_of
from shared.core.arguments import from_args
from shared.core.config import TownConfig
from shared.core.errors import CommandError
from shared.model.commands import (
    SEVERITIES,
    EscalationAck,
    EscalationClose,
    EscalationRaise,
    MailArchive,
    MailRead,
    MailReply,
    MailSend,
)
from shared.model.commands.base import MAX_DESCRIPTION
from shared.model.commands.mail import ACCEPTED_ADDRESSES, normalise_address
from shared.model.queries import mayor
from shared.model.results import MailResult

if TYPE_CHECKING:
    from shared.bus.connection import Connection


def register(sub: Subcommands) -> None:
    mail = sub.group("mail", "mail: send, inbox, read, reply, archive, thread", "mail_cmd")

    s = mail.command("send", _send, help="send a message (body from --body, or standard input)")
    s.add_argument("to", help=f"address: {ACCEPTED_ADDRESSES}")
    s.add_argument("--subject", "-s", default="")
    s.add_argument("--body", "-b", help="default: read from standard input")
    s.add_argument("--thread")

    i = mail.query("inbox", _inbox, help="open, unread messages to an address (default: you)")
    i.add_argument("address", nargs="?")
    i.add_argument("--all", action="store_true", help="read ones too")
    limit_option(i)

    r = mail.query("read", _read, help="show a message; it is marked read when it is yours")
    r.add_argument("id")
    r.add_argument("--actor")

    rp = mail.command("reply", _reply, help="answer a message: to its sender, in its thread")
    rp.add_argument("id")
    rp.add_argument("--body", "-b", help="default: read from standard input")
    rp.add_argument("--subject", "-s", default="")

    a = mail.command("archive", _archive, help="close a message")
    a.add_argument("id")

    t = mail.query("thread", _thread, help="a thread's messages in order")
    t.add_argument("thread")

    e = sub.command("escalate", _escalate, help="put a problem before the operator")
    e.add_argument("message")
    e.add_argument("--severity", "-s", choices=SEVERITIES, default="medium")
    e.add_argument("--source", help="who or what is raising it (default: the actor)")
    e.add_argument("--bead", help="the bead it is about")

    ls = sub.query("escalations", _escalations, help="open escalations, most severe first")
    ls.add_argument("--all", action="store_true", help="closed ones too")
    limit_option(ls)

    esc = sub.group("escalation", "escalations: ack, close", "escalation_cmd")
    ack = esc.command("ack", _ack, help="someone is on it: it is not raised further")
    ack.add_argument("id")
    close = esc.command("close", _close, help="resolved")
    close.add_argument("id")
    close.add_argument("--reason", "-r", default="")


def _me(args: argparse.Namespace) -> str:
    # Inside a polecat session its inbox is the polecat's: the address its mail is sent from.
    explicit = getattr(args, "actor", None)
    return identity.default_actor(explicit) or os.environ.get("GT_ACTOR") or identity.OPERATOR


def _body(args: argparse.Namespace) -> str:
    if args.body is not None:
        return str(args.body)
    if sys.stdin.isatty():
        raise UsageError("give the message with --body, or pipe it in")
    body = sys.stdin.read(MAX_DESCRIPTION + 1)  # no more than a body may hold is read (a 5 GB pipe is refused)
    if len(body) > MAX_DESCRIPTION:
        raise CommandError("invalid", f"`body` (standard input) is over {MAX_DESCRIPTION} characters, its limit")
    return body


def sent_lines(result: MailResult) -> str:
    """One line per message sent: a mail to a rig is one message to each polecat at work there, each with its id."""
    thread = result.thread
    copies = list(zip(result.ids or [], result.recipients or [], strict=False))
    if not copies:
        return f"{result.id}: sent to {result.to} (thread {thread})"
    return "\n".join(f"{message}: sent to {inbox} (thread {thread}, {result.to})" for message, inbox in copies)


async def _send(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    cmd = MailSend(to=normalise_address(args.to), subject=args.subject, body=_body(args), thread=args.thread)
    return await send(nc, args, config, cmd, sent_lines)


async def _reply(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    return await send(nc, args, config, MailReply(id=args.id, subject=args.subject, body=_body(args)), sent_lines)


async def _archive(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    return await send(nc, args, config, MailArchive(id=args.id), status_line)


async def _inbox(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = mayor.Inbox(
        to=normalise_address(args.address) if args.address else _me(args), include_read=args.all, limit=args.limit
    )
    return show_reply(args, query, await read(nc, config, query), render.message_table)


async def _read(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = mayor.Get(id=args.id)
    answer = await read(nc, config, query)
    message = reply_of(query, answer)
    if message.type != "message":
        print(f"gt: {args.id} is a {message.type}, not a message", file=sys.stderr)
        return EXIT_REJECTED
    # Read as the inbox is listed: `--actor`, else (outside a session) GT_ACTOR; only its addressee's reading marks
    # a message read.
    reader = args.actor or (None if identity.session_origin() is not None else os.environ.get("GT_ACTOR"))
    cmd = MailRead(id=args.id, actor=reader)
    outcome = await client.send(nc, config, cmd, timeout=DEFAULT_COMMAND_TIMEOUT_S)
    if (rejected := outcome.rejected) is not None:
        print(rejected_line(rejected), file=sys.stderr)
        return EXIT_REJECTED
    accepted = outcome.accepted
    if accepted is not None and accepted.result.left_unread_for:
        print(
            f"gt: left unread for {accepted.result.left_unread_for} (only its addressee's reading marks it read)",
            file=sys.stderr,
        )
    return show(args, answer, lambda _: render.message_detail(message))


async def _thread(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = mayor.Thread(thread=args.thread)
    return show_reply(args, query, await read(nc, config, query), render.thread_lines)


async def _escalate(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    # An agent asks for help with its work: once its session's bead is closed, the mayor closes it.
    working_on = os.environ.get("GT_BEAD") if os.environ.get("GT_SESSION") else None
    cmd = from_args(EscalationRaise, args, resolved_when=[f"bead:{working_on}"] if working_on else [])
    return await send(nc, args, config, cmd, print_id)


async def _escalations(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = mayor.Escalations(include_closed=args.all, limit=args.limit)
    return show_reply(args, query, await read(nc, config, query), render.escalation_table)


async def _ack(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    return await send(nc, args, config, EscalationAck(id=args.id), status_line)


async def _close(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    return await send(nc, args, config, EscalationClose(id=args.id, reason=args.reason), status_line)
