"""Command bodies as the operator sends them, and their parsing into typed commands.

Parsing never raises anything but ``CommandError`` with one of DESIGN.md's reason codes, so every bad
input ends in a ``cmd.rejected`` a person can act on.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from shared.errors import CommandError
from shared.ids import PREFIX_PATTERN, is_valid_id

DEFAULT_MAX_COMMAND_BYTES = 1024 * 1024
MAX_TITLE = 500
MAX_LABEL = 128
MAX_ACTOR = 128


class Command(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Fields every command body may carry."""

    SUBJECT: ClassVar[str] = ""
    cmd_id: str | None = None
    actor: str | None = None
    correlation_id: str | None = None


class BeadCreate(Command, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Create a bead. The mayor assigns ``<prefix>-<base36>``; status starts ``open``."""

    SUBJECT: ClassVar[str] = "gt.cmd.bead.create"
    title: str
    type: str = "task"
    priority: int = 2
    description: str = ""
    labels: list[str] = []
    metadata: dict[str, str] = {}
    parent: str | None = None
    needs: list[str] = []
    assignee: str | None = None
    prefix: str = "hq"


class BeadUpdate(Command, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Change fields of a bead. ``labels`` are added, ``remove_labels`` removed, ``metadata`` merged."""

    SUBJECT: ClassVar[str] = "gt.cmd.bead.update"
    id: str
    title: str | None = None
    type: str | None = None
    priority: int | None = None
    description: str | None = None
    assignee: str | None = None
    parent: str | None = None
    labels: list[str] = []
    remove_labels: list[str] = []
    metadata: dict[str, str] = {}
    needs: list[str] = []
    status: str | None = None
    """Only to state the current status; moving it goes through claim/close (backward is refused)."""


class BeadClaim(Command, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Claim a bead for an assignee: open or hooked -> in_progress."""

    SUBJECT: ClassVar[str] = "gt.cmd.bead.claim"
    id: str
    assignee: str


class BeadClose(Command, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Close a bead. Closing a closed bead succeeds and changes nothing."""

    SUBJECT: ClassVar[str] = "gt.cmd.bead.close"
    id: str
    reason: str = ""


COMMANDS: dict[str, type[Command]] = {c.SUBJECT: c for c in (BeadCreate, BeadUpdate, BeadClaim, BeadClose)}
_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {s: msgspec.json.Decoder(c) for s, c in COMMANDS.items()}
_ANY_DECODER = msgspec.json.Decoder()


class RawCommand(msgspec.Struct, frozen=True, kw_only=True):
    """What arrived on GT_CMD, before parsing."""

    subject: str
    body: bytes
    stream_seq: int
    header_id: str | None = None


def peek_body_fields(body: bytes) -> tuple[str | None, str | None, str | None]:
    """Best effort ``(cmd_id, actor, correlation_id)`` from a body that may be invalid, for the outcome."""
    try:
        obj = _ANY_DECODER.decode(body)
    except msgspec.DecodeError:
        return None, None, None
    if not isinstance(obj, dict):
        return None, None, None

    def text(key: str, limit: int) -> str | None:
        value = obj.get(key)
        return value if isinstance(value, str) and value and len(value) <= limit else None

    return text("cmd_id", 10_000), text("actor", MAX_ACTOR), text("correlation_id", 128)


def parse_command(subject: str, body: bytes, *, max_bytes: int = DEFAULT_MAX_COMMAND_BYTES) -> Command:
    """Turn raw bytes on ``subject`` into a typed command, or raise ``CommandError`` with a reason code."""
    if len(body) > max_bytes:
        raise CommandError("too_large", f"command body is {len(body)} bytes; the limit is {max_bytes}")
    decoder = _DECODERS.get(subject)
    try:
        obj = _ANY_DECODER.decode(body)
    except msgspec.DecodeError as exc:
        raise CommandError("malformed", f"body is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise CommandError("malformed", f"body must be a JSON object, got {type(obj).__name__}")
    if decoder is None:
        known = ", ".join(sorted(COMMANDS))
        raise CommandError("unknown_command", f"no command {subject!r}; known commands: {known}")
    try:
        cmd: Command = decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise CommandError("invalid", str(exc)) from exc
    validate(cmd)
    return cmd


def _check_id(field: str, value: str | None) -> None:
    if value is not None and not is_valid_id(value):
        raise CommandError("invalid", f"`{field}` {value!r} is not a valid id (lowercase a-z, 0-9, '_' and '-', 1-64)")


def _check_text(field: str, value: str | None, limit: int, *, required: bool = False) -> None:
    if value is None:
        return
    if required and not value.strip():
        raise CommandError("invalid", f"`{field}` must not be empty")
    if len(value) > limit:
        raise CommandError("invalid", f"`{field}` is {len(value)} characters; the limit is {limit}")


def _check_labels(field: str, labels: list[str]) -> None:
    for label in labels:
        if not label.strip() or len(label) > MAX_LABEL:
            raise CommandError("invalid", f"`{field}` has an empty or over-long label: {label[:40]!r}")


def _check_priority(value: int | None) -> None:
    if value is not None and not 0 <= value <= 4:  # noqa: PLR2004
        raise CommandError("invalid", f"`priority` must be 0-4, got {value}")


def validate(cmd: Command) -> None:
    """Field checks msgspec's types cannot express."""
    _check_text("actor", cmd.actor, MAX_ACTOR)
    if isinstance(cmd, BeadCreate):
        _check_text("title", cmd.title, MAX_TITLE, required=True)
        _check_priority(cmd.priority)
        if not PREFIX_PATTERN.fullmatch(cmd.prefix):
            raise CommandError("invalid", f"`prefix` {cmd.prefix!r} must match {PREFIX_PATTERN.pattern}")
        _check_text("type", cmd.type, 64, required=True)
        _check_labels("labels", cmd.labels)
        _check_id("parent", cmd.parent)
        _check_text("assignee", cmd.assignee, MAX_ACTOR, required=True)
        for need in cmd.needs:
            _check_id("needs", need)
    elif isinstance(cmd, BeadUpdate):
        _check_id("id", cmd.id)
        _check_text("title", cmd.title, MAX_TITLE, required=True)
        _check_text("type", cmd.type, 64, required=True)
        _check_priority(cmd.priority)
        _check_labels("labels", cmd.labels)
        _check_labels("remove_labels", cmd.remove_labels)
        _check_id("parent", cmd.parent)
        for need in cmd.needs:
            _check_id("needs", need)
    elif isinstance(cmd, BeadClaim):
        _check_id("id", cmd.id)
        _check_text("assignee", cmd.assignee, MAX_ACTOR, required=True)
    elif isinstance(cmd, BeadClose):
        _check_id("id", cmd.id)
        _check_text("reason", cmd.reason, 2000)
