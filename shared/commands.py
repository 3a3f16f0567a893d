"""Command bodies as operators send them (JSON on ``gt.cmd.<aggregate>.<verb>``), and their parsing.

Parsing never raises anything but ``CommandError`` with one of DESIGN.md's reason codes, so every bad
input ends in a ``cmd.rejected`` a person can act on.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import msgspec

from shared.errors import CommandError
from shared.ids import ID_PATTERN, PREFIX_PATTERN, is_valid_id

DEFAULT_MAX_COMMAND_BYTES = 1024 * 1024
MAX_TITLE = 500
MAX_DESCRIPTION = 256 * 1024
MAX_LABEL = 128
MAX_ACTOR = 128
MAX_REASON = 4096
MAX_META_KEY = 128
MAX_META_VALUE = 64 * 1024
MAX_LIST = 256
TYPE_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


class Command(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Fields every command body may carry."""

    SUBJECT: ClassVar[str] = ""
    cmd_id: str | None = None
    """The command's id when no ``Nats-Msg-Id`` header is given; resending the same id is harmless."""
    actor: str | None = None
    """Who is acting (default ``operator``)."""
    correlation_id: str | None = None
    """Ties the command's events to a larger piece of work."""

    def validate(self) -> None:
        """Field checks msgspec's types cannot express; raises ``CommandError('invalid', ...)``."""
        _check_text("actor", self.actor, MAX_ACTOR, required=True)


class BeadCreate(Command, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """File a bead. The mayor assigns ``<prefix>-<base36>``; status starts ``open``."""

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

    def validate(self) -> None:
        super().validate()
        _check_text("title", self.title, MAX_TITLE, required=True)
        _check_type(self.type)
        _check_priority(self.priority)
        _check_text("description", self.description, MAX_DESCRIPTION)
        _check_labels("labels", self.labels)
        _check_metadata(self.metadata)
        _check_id("parent", self.parent)
        _check_ids("needs", self.needs)
        _check_text("assignee", self.assignee, MAX_ACTOR, required=True)
        if not PREFIX_PATTERN.fullmatch(self.prefix):
            raise CommandError("invalid", f"`prefix` {self.prefix!r} must match {PREFIX_PATTERN.pattern}")


class BeadUpdate(Command, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Change a bead's fields. ``labels`` are added, ``remove_labels`` removed, ``metadata`` merged,
    ``needs`` added; ``assignee`` or ``parent`` set to "" clears them. ``status`` may only move forward:
    ``in_progress`` claims the bead, ``closed`` closes it."""

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

    def validate(self) -> None:
        super().validate()
        _check_id("id", self.id, required=True)
        _check_text("title", self.title, MAX_TITLE, required=True)
        if self.type is not None:
            _check_type(self.type)
        _check_priority(self.priority)
        _check_text("description", self.description, MAX_DESCRIPTION)
        _check_text("assignee", self.assignee, MAX_ACTOR)
        if self.parent:
            _check_id("parent", self.parent)
        _check_labels("labels", self.labels)
        _check_labels("remove_labels", self.remove_labels)
        _check_metadata(self.metadata)
        _check_ids("needs", self.needs)


class BeadClaim(Command, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Take a bead for ``assignee``: open or hooked -> in_progress."""

    SUBJECT: ClassVar[str] = "gt.cmd.bead.claim"
    id: str
    assignee: str

    def validate(self) -> None:
        super().validate()
        _check_id("id", self.id, required=True)
        _check_text("assignee", self.assignee, MAX_ACTOR, required=True)


class BeadClose(Command, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Close a bead. Closing a closed bead succeeds and changes nothing."""

    SUBJECT: ClassVar[str] = "gt.cmd.bead.close"
    id: str
    reason: str = ""

    def validate(self) -> None:
        super().validate()
        _check_id("id", self.id, required=True)
        _check_text("reason", self.reason, MAX_REASON)


COMMANDS: dict[str, type[Command]] = {c.SUBJECT: c for c in (BeadCreate, BeadUpdate, BeadClaim, BeadClose)}
_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {s: msgspec.json.Decoder(c) for s, c in COMMANDS.items()}
_ANY_DECODER = msgspec.json.Decoder()


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
        return value if isinstance(value, str) and value.strip() and len(value) <= limit else None

    return text("cmd_id", 10_000), text("actor", MAX_ACTOR), text("correlation_id", 128)


def parse_command(subject: str, body: bytes, *, max_bytes: int = DEFAULT_MAX_COMMAND_BYTES) -> Command:
    """Turn raw bytes on ``subject`` into a typed, validated command.

    Raises:
        CommandError: with code ``too_large``, ``malformed``, ``unknown_command`` or ``invalid``.
    """
    if len(body) > max_bytes:
        raise CommandError("too_large", f"the command body is {len(body)} bytes; the limit is {max_bytes}")
    try:
        obj = _ANY_DECODER.decode(body)
    except msgspec.DecodeError as exc:
        raise CommandError("malformed", f"the body is not valid JSON ({exc}); send a JSON object") from exc
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
    cmd.validate()
    return cmd


def _json_kind(value: object) -> str:
    kinds = {list: "array", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def _check_id(field: str, value: str | None, *, required: bool = False) -> None:
    if value is None:
        if required:
            raise CommandError("invalid", f"`{field}` is required")
        return
    if not is_valid_id(value):
        raise CommandError(
            "invalid",
            f"`{field}` {value[:80]!r} is not a valid id: it must match {ID_PATTERN.pattern} "
            "(lowercase letters, digits, '_' and '-'; no dots, spaces or wildcards)",
        )


def _check_ids(field: str, values: list[str]) -> None:
    if len(values) > MAX_LIST:
        raise CommandError("invalid", f"`{field}` has {len(values)} entries; the limit is {MAX_LIST}")
    for value in values:
        _check_id(field, value)


def _check_text(field: str, value: str | None, limit: int, *, required: bool = False) -> None:
    if value is None:
        return
    if required and not value.strip():
        raise CommandError("invalid", f"`{field}` must not be empty")
    if len(value) > limit:
        raise CommandError("invalid", f"`{field}` is {len(value)} characters; the limit is {limit}")


def _check_type(value: str) -> None:
    if not TYPE_PATTERN.fullmatch(value):
        raise CommandError("invalid", f"`type` {value[:80]!r} must match {TYPE_PATTERN.pattern} (e.g. task, bug)")


def _check_labels(field: str, labels: list[str]) -> None:
    if len(labels) > MAX_LIST:
        raise CommandError("invalid", f"`{field}` has {len(labels)} entries; the limit is {MAX_LIST}")
    for label in labels:
        if not label.strip() or len(label) > MAX_LABEL:
            raise CommandError(
                "invalid", f"`{field}` has an empty or over-long label {label[:40]!r} (1-{MAX_LABEL} characters)"
            )


def _check_metadata(metadata: dict[str, str]) -> None:
    if len(metadata) > MAX_LIST:
        raise CommandError("invalid", f"`metadata` has {len(metadata)} keys; the limit is {MAX_LIST}")
    for key, value in metadata.items():
        if not key.strip() or len(key) > MAX_META_KEY:
            raise CommandError("invalid", f"`metadata` key {key[:40]!r} must be 1-{MAX_META_KEY} characters")
        if len(value) > MAX_META_VALUE:
            raise CommandError("invalid", f"`metadata` value of {key!r} is over {MAX_META_VALUE} characters")


def _check_priority(value: int | None) -> None:
    if value is not None and not 0 <= value <= 4:
        raise CommandError("invalid", f"`priority` must be 0-4 (0 highest), got {value}")
