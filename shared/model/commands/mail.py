"""Mail commands (``gt.cmd.mail.<verb>``): messages are beads of type ``message``, owned by the mayor."""

from __future__ import annotations

import re
from typing import ClassVar

from shared.core.ids import MAIL_PREFIX
from shared.model.commands.base import (
    MAX_ACTOR,
    MAX_DESCRIPTION,
    MAX_TITLE,
    Command,
    Creates,
    check_id,
    check_priority,
    check_text,
)
from shared.model.results import BeadResult, MailReadResult, MailResult

_NAME = r"[a-z0-9][a-z0-9_-]{0,63}"
POLECAT_ADDRESS = re.compile(rf"^polecat:(?P<rig>{_NAME})/(?P<polecat>{_NAME})$")
SHORT_POLECAT_ADDRESS = re.compile(rf"^(?P<rig>{_NAME})/(?P<polecat>{_NAME})$")
RIG_ADDRESS = re.compile(rf"^(?:rig:)?(?P<rig>{_NAME})$")
OPERATOR_ADDRESS = re.compile(r"^operator(?::[A-Za-z0-9][A-Za-z0-9._@-]{0,63})?$")
ACCEPTED_ADDRESSES = (
    "mayor, operator or operator:<name>, polecat:<rig>/<name> (or <rig>/<name>), "
    "rig:<rig> (or <rig>) for every polecat at work on the rig"
)


def polecat_address(rig: str, polecat: str) -> str:
    return f"polecat:{rig}/{polecat}"


def normalise_address(address: str) -> str:
    """The canonical form of an address: ``<rig>/<name>`` is ``polecat:<rig>/<name>``; others as given."""
    address = address.strip()
    short = SHORT_POLECAT_ADDRESS.fullmatch(address)
    return polecat_address(short["rig"], short["polecat"]) if short else address


def polecat_of(address: str) -> tuple[str, str] | None:
    """(rig, polecat) of a ``polecat:<rig>/<name>`` address; None for any other."""
    match = POLECAT_ADDRESS.fullmatch(address)
    return (match["rig"], match["polecat"]) if match else None


class MailSend(Creates[MailResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Send a message to an address: ``mayor``, ``operator`` or ``operator:<name>``, ``polecat:<rig>/<name>`` (or
    ``<rig>/<name>``), ``rig:<rig>`` (or ``<rig>``: one message to each polecat at work on the rig; ``new_id`` is
    the first one's, and the thread's). The mayor refuses a rig or polecat the log does not know."""

    SUBJECT: ClassVar[str] = "gt.cmd.mail.send"
    OWNER: ClassVar[str] = "mayor"
    ORDERED_BY = ("bead", "new_id")  # a message is a bead
    to: str
    body: str
    subject: str = ""
    """Default: the body's first line (80 characters at most)."""
    thread: str | None = None
    """Continue this thread; default: a new thread named after the message."""
    priority: int = 2

    def id_prefix(self) -> str:
        return MAIL_PREFIX

    def validate(self) -> None:
        super().validate()
        check_text("to", self.to, MAX_ACTOR, nonblank=True)
        check_text("body", self.body, MAX_DESCRIPTION, nonblank=True)
        check_text("subject", self.subject, MAX_TITLE)
        check_id("thread", self.thread)
        check_priority(self.priority)


class MailRead(Command[MailReadResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Mark a message read (it stays in the thread; archive closes it)."""

    SUBJECT: ClassVar[str] = "gt.cmd.mail.read"
    OWNER: ClassVar[str] = "mayor"
    ORDERED_BY = ("bead", "id")
    REQUIRED_IDS = ("id",)
    id: str


class MailReply(Creates[MailResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Answer a message: to its sender, in its thread."""

    SUBJECT: ClassVar[str] = "gt.cmd.mail.reply"
    OWNER: ClassVar[str] = "mayor"
    ORDERED_BY = ("bead", "new_id")  # a message is a bead
    REQUIRED_IDS = ("id",)
    id: str
    body: str
    subject: str = ""
    """Default: ``Re: <the original subject>``."""

    def id_prefix(self) -> str:
        return MAIL_PREFIX

    def validate(self) -> None:
        super().validate()
        check_text("body", self.body, MAX_DESCRIPTION, nonblank=True)
        check_text("subject", self.subject, MAX_TITLE)


class MailArchive(Command[BeadResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Close a message: it leaves the inbox (archiving an archived message changes nothing)."""

    SUBJECT: ClassVar[str] = "gt.cmd.mail.archive"
    OWNER: ClassVar[str] = "mayor"
    ORDERED_BY = ("bead", "id")
    REQUIRED_IDS = ("id",)
    id: str


MAIL_COMMANDS: tuple[type[Command], ...] = (MailSend, MailRead, MailReply, MailArchive)
