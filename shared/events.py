"""The event envelope, the typed payloads, and the two-step decoder.

Events are stored as JSON envelopes; the payload type lives in ``type`` and the payload in ``data``.
Decoding reads the envelope first (``data`` kept raw), then decodes ``data`` by type, so a service that
meets a type it does not know can log it and move on instead of crashing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar

import msgspec

from shared.errors import GastownError


class Envelope(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What is stored on ``gt.evt.<aggregate>.<id>``."""

    id: str
    type: str
    v: int = 1
    ts: datetime
    actor: str
    causation_id: str | None = None
    correlation_id: str | None = None
    data: msgspec.Raw


class Event(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Base of every payload. ``TYPE`` is the stable tag stored in the envelope; ``AGGREGATE`` names the subject."""

    TYPE: ClassVar[str] = ""
    AGGREGATE: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1

    def aggregate_id(self) -> str:
        raise NotImplementedError


# ---- beads -----------------------------------------------------------------------------------------


class BeadEvent(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "bead"
    bead_id: str

    def aggregate_id(self) -> str:
        return self.bead_id


class BeadCreated(BeadEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "bead.created"
    title: str
    type: str = "task"
    priority: int = 2
    description: str = ""
    labels: list[str] = []
    metadata: dict[str, str] = {}
    parent: str | None = None
    needs: list[str] = []
    assignee: str | None = None


class BeadUpdated(BeadEvent, frozen=True, kw_only=True):
    """Only the fields present changed. ``add_labels`` appends; ``metadata`` merges."""

    TYPE: ClassVar[str] = "bead.updated"
    title: str | msgspec.UnsetType = msgspec.UNSET
    type: str | msgspec.UnsetType = msgspec.UNSET
    priority: int | msgspec.UnsetType = msgspec.UNSET
    description: str | msgspec.UnsetType = msgspec.UNSET
    assignee: str | None | msgspec.UnsetType = msgspec.UNSET
    parent: str | None | msgspec.UnsetType = msgspec.UNSET
    add_labels: list[str] = []
    remove_labels: list[str] = []
    metadata: dict[str, str] = {}
    add_needs: list[str] = []


class BeadClaimed(BeadEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "bead.claimed"
    assignee: str


class BeadClosed(BeadEvent, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "bead.closed"
    reason: str = ""


# ---- command outcomes ------------------------------------------------------------------------------


class EventRef(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    type: str
    subject: str


class CommandOutcome(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "cmd"
    command_id: str
    command: str

    def aggregate_id(self) -> str:
        return self.command_id


class CommandAccepted(CommandOutcome, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "cmd.accepted"
    events: list[EventRef] = []
    result: dict[str, Any] = {}


class CommandRejected(CommandOutcome, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "cmd.rejected"
    code: str
    message: str


# ---- registry and codec ----------------------------------------------------------------------------

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


class UnknownEventTypeError(GastownError):
    def __init__(self, type_: str, v: int) -> None:
        self.type = type_
        self.v = v
        super().__init__(f"unknown event type {type_!r} v{v}")


class EventDecodeError(GastownError):
    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"cannot decode event: {detail}")


class EventRegistry:
    """Type tag -> payload class, with decoders built once and an upcaster chain for old versions."""

    def __init__(self) -> None:
        self._classes: dict[str, type[Event]] = {}
        self._decoders: dict[str, msgspec.json.Decoder[Any]] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}

    def register(self, cls: type[Event]) -> type[Event]:
        if not cls.TYPE:
            raise ValueError(f"{cls.__name__} has no TYPE")
        if cls.TYPE in self._classes and self._classes[cls.TYPE] is not cls:
            raise ValueError(f"event type {cls.TYPE!r} registered twice")
        self._classes[cls.TYPE] = cls
        self._decoders[cls.TYPE] = msgspec.json.Decoder(cls)
        return cls

    def register_upcaster(self, type_: str, from_version: int, fn: Upcaster) -> None:
        """``fn`` turns a payload of ``from_version`` into one of ``from_version + 1``."""
        self._upcasters[(type_, from_version)] = fn

    def classes(self) -> dict[str, type[Event]]:
        return dict(self._classes)

    def decode_payload(self, env: Envelope) -> Event:
        cls = self._classes.get(env.type)
        if cls is None:
            raise UnknownEventTypeError(env.type, env.v)
        try:
            if env.v == cls.VERSION:
                payload: Event = self._decoders[env.type].decode(env.data)
                return payload
            if env.v > cls.VERSION:
                raise UnknownEventTypeError(env.type, env.v)
            data: dict[str, Any] = msgspec.json.decode(env.data)
            for version in range(env.v, cls.VERSION):
                upcast = self._upcasters.get((env.type, version))
                if upcast is None:
                    raise EventDecodeError(f"no upcaster for {env.type} v{version}")
                data = upcast(data)
            converted: Event = msgspec.convert(data, cls)
            return converted  # noqa: TRY300
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise EventDecodeError(f"{env.type} v{env.v}: {exc}") from exc


REGISTRY = EventRegistry()
for _cls in (BeadCreated, BeadUpdated, BeadClaimed, BeadClosed, CommandAccepted, CommandRejected):
    REGISTRY.register(_cls)

_ENVELOPE_DECODER = msgspec.json.Decoder(Envelope)
_ENCODER = msgspec.json.Encoder()


def decode_envelope(raw: bytes | memoryview) -> Envelope:
    try:
        return _ENVELOPE_DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise EventDecodeError(str(exc)) from exc


def encode_event(
    payload: Event,
    *,
    event_id: str,
    ts: datetime,
    actor: str,
    causation_id: str | None = None,
    correlation_id: str | None = None,
) -> bytes:
    env = Envelope(
        id=event_id,
        type=payload.TYPE,
        v=payload.VERSION,
        ts=ts,
        actor=actor,
        causation_id=causation_id,
        correlation_id=correlation_id,
        data=msgspec.Raw(_ENCODER.encode(payload)),
    )
    return _ENCODER.encode(env)


class StoredEvent(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """An event as read back from the log: its stream sequence, subject, envelope and typed payload."""

    seq: int
    subject: str
    envelope: Envelope
    payload: Event
