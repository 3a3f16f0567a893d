"""Every command body operators, agents and plugins may send, and their parsing into typed commands."""

from __future__ import annotations

from typing import Any

import msgspec

from shared.core.decoding import UNDECODABLE
from shared.core.errors import CommandError
from shared.model.commands.automations import AUTOMATION_COMMANDS, AutomationRun
from shared.model.commands.base import DEFAULT_MAX_COMMAND_BYTES, MAX_ACTOR, Command, Fence
from shared.model.commands.beads import (
    BEAD_COMMANDS,
    BeadClaim,
    BeadClose,
    BeadCreate,
    BeadSling,
    BeadUnsling,
    BeadUpdate,
)
from shared.model.commands.convoys import CONVOY_COMMANDS, ConvoyAdd, ConvoyCreate, ConvoyLand
from shared.model.commands.crew import CREW_COMMANDS, CrewAdd, CrewHook, CrewRemove
from shared.model.commands.escalations import (
    ESCALATION_COMMANDS,
    SEVERITIES,
    EscalationAck,
    EscalationClose,
    EscalationRaise,
)
from shared.model.commands.gc import GC_COMMANDS, GcSweep
from shared.model.commands.leases import LEASE_COMMANDS, LeaseAcquire, LeaseRelease
from shared.model.commands.mail import MAIL_COMMANDS, MailArchive, MailRead, MailReply, MailSend
from shared.model.commands.rigs import (
    POLECAT_TARGET,
    RIG_COMMANDS,
    MergeQueueResume,
    MergeRequestDone,
    MergeRequestReject,
    MergeRequestRetry,
    MergeRequestSubmit,
    NudgeSend,
    RigAdd,
    RigPark,
    RigRemove,
    RigUnpark,
    RigUpdate,
    SessionDoneIntentCmd,
    SessionFinish,
    SessionHandoff,
    SessionRecoverHook,
    SessionStop,
)
from shared.model.commands.town_agents import TOWN_AGENT_COMMANDS, TownAgentAsk, TownAgentStart, TownAgentStop
from shared.model.commands.work import STEP_COMMANDS, GateApprove, GateOpen, StepDone, StepStart

COMMANDS: dict[str, type[Command]] = {
    c.SUBJECT: c
    for c in (
        *BEAD_COMMANDS,
        *STEP_COMMANDS,
        *CONVOY_COMMANDS,
        *MAIL_COMMANDS,
        *ESCALATION_COMMANDS,
        *RIG_COMMANDS,
        *LEASE_COMMANDS,
        *AUTOMATION_COMMANDS,
        *GC_COMMANDS,
        *TOWN_AGENT_COMMANDS,
        *CREW_COMMANDS,
    )
}
_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {s: msgspec.json.Decoder(c) for s, c in COMMANDS.items()}
_ANY_DECODER = msgspec.json.Decoder()


def peek_body_fields(body: bytes) -> tuple[str | None, str | None, str | None]:
    """Best effort ``(cmd_id, actor, correlation_id)`` from a body that may be invalid, for the outcome."""
    try:
        obj = _ANY_DECODER.decode(body)
    except Exception:  # noqa: BLE001 - any body at all: invalid UTF-8, nesting past the recursion limit, ...
        return None, None, None
    if not isinstance(obj, dict):
        return None, None, None

    def text(key: str, limit: int) -> str | None:
        value = obj.get(key)
        return value if isinstance(value, str) and value.strip() and len(value) <= limit else None

    return text("cmd_id", 10_000), text("actor", MAX_ACTOR), text("correlation_id", 128)


def read_command(subject: str, body: bytes, *, max_bytes: int = DEFAULT_MAX_COMMAND_BYTES) -> Command | CommandError:
    """``parse_command`` for bodies anyone may have written: whatever goes wrong reading them is returned as the
    command's rejection, never raised, so no body can end the loop that reads it."""
    try:
        return parse_command(subject, body, max_bytes=max_bytes)
    except CommandError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - a check that failed on a strange value: still the sender's answer
        return CommandError("invalid", f"the command could not be checked ({type(exc).__name__}: {exc!s:.200})")


def parse_command(subject: str, body: bytes, *, max_bytes: int = DEFAULT_MAX_COMMAND_BYTES) -> Command:
    """Turn raw bytes on ``subject`` into a typed, validated command.

    Raises:
        CommandError: with code ``too_large``, ``malformed``, ``unknown_command`` or ``invalid``.
    """
    if len(body) > max_bytes:
        raise CommandError("too_large", f"the command body is {len(body)} bytes; the limit is {max_bytes}")
    try:
        obj = _ANY_DECODER.decode(body)
    except UNDECODABLE as exc:
        raise undecodable(exc) from exc
    if not isinstance(obj, dict):
        raise CommandError("malformed", f"the body must be a JSON object, got a JSON {_json_kind(obj)}")
    decoder = _DECODERS.get(subject)
    if decoder is None:
        known = ", ".join(sorted(COMMANDS))
        raise CommandError("unknown_command", f"there is no command {subject!r}; known commands: {known}")
    try:
        cmd: Command = decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise CommandError("invalid", str(exc)) from exc
    except UNDECODABLE as exc:
        raise undecodable(exc) from exc
    cmd.validate()
    return cmd


def check_to_send(cmd: Command, body: bytes, *, max_bytes: int) -> None:
    """Refuse, before it is sent, what the intake would refuse of ``cmd`` whose encoded body is ``body``: a field
    over its limit (a mail's body over 256 KiB: named, in the intake's words), or a body over ``max_bytes`` (the
    intake's limit, or less: the largest message the server carries). A client says it in one line and stores
    nothing; a body over the server's limit would not even be carried.

    Raises:
        CommandError: ``invalid`` (the field named) or ``too_large``.
    """
    cmd.validate()
    if len(body) > max_bytes:
        raise CommandError(
            "too_large", f"the command is {len(body)} bytes; the limit is {max_bytes} (shorten what it carries)"
        )


def undecodable(exc: Exception) -> CommandError:
    """The ``malformed`` rejection of a body the JSON decoder could not read, saying why in a person's words."""
    if isinstance(exc, UnicodeDecodeError):
        why = f"it is not valid UTF-8 (byte {exc.object[exc.start : exc.start + 1]!r} inside a string)"
    elif isinstance(exc, msgspec.DecodeError) and "UTF-8" in str(exc):
        # msgspec 0.23 and later say it in a DecodeError of their own (0.22: UnicodeDecodeError, above).
        why = "it is not valid UTF-8 (a string holds bytes that are not UTF-8)"
    elif isinstance(exc, RecursionError):
        why = "it is nested too deeply"
    else:
        why = f"{exc!s:.300}"
    return CommandError("malformed", f"the body is not valid JSON ({why}); send a JSON object")


def _json_kind(value: object) -> str:
    kinds = {list: "array", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


__all__ = [
    "COMMANDS",
    "CREW_COMMANDS",
    "DEFAULT_MAX_COMMAND_BYTES",
    "POLECAT_TARGET",
    "SEVERITIES",
    "TOWN_AGENT_COMMANDS",
    "AutomationRun",
    "BeadClaim",
    "BeadClose",
    "BeadCreate",
    "BeadSling",
    "BeadUnsling",
    "BeadUpdate",
    "Command",
    "ConvoyAdd",
    "ConvoyCreate",
    "ConvoyLand",
    "CrewAdd",
    "CrewHook",
    "CrewRemove",
    "EscalationAck",
    "EscalationClose",
    "EscalationRaise",
    "Fence",
    "GateApprove",
    "GateOpen",
    "GcSweep",
    "LeaseAcquire",
    "LeaseRelease",
    "MailArchive",
    "MailRead",
    "MailReply",
    "MailSend",
    "MergeQueueResume",
    "MergeRequestDone",
    "MergeRequestReject",
    "MergeRequestRetry",
    "MergeRequestSubmit",
    "NudgeSend",
    "RigAdd",
    "RigPark",
    "RigRemove",
    "RigUnpark",
    "RigUpdate",
    "SessionDoneIntentCmd",
    "SessionFinish",
    "SessionHandoff",
    "SessionRecoverHook",
    "SessionStop",
    "StepDone",
    "StepStart",
    "TownAgentAsk",
    "TownAgentStart",
    "TownAgentStop",
    "check_to_send",
    "parse_command",
    "peek_body_fields",
    "read_command",
]
