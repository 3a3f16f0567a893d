"""The event envelope, the payload base class, the two-step codec and the type registry.

Events are stored as JSON envelopes on ``gt.evt.<aggregate>.<id>``; the payload type lives in ``type`` and
the payload in ``data``. Decoding reads the envelope first (``data`` kept raw), then decodes ``data`` by
type, so a service that meets a type it does not know can log it and move on instead of crashing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, ClassVar

import msgspec

from shared.core import subjects
from shared.core.decoding import UNDECODABLE
from shared.core.errors import EventDecodeError, UnknownEventTypeError


class Envelope(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What is stored on ``gt.evt.<aggregate>.<id>``."""

    id: str
    """Unique event id."""
    type: str
    """Stable payload tag, e.g. ``bead.created``."""
    v: int = 1
    """Schema version of this payload type."""
    ts: datetime
    """When the writer decided the event (UTC)."""
    actor: str
    """Who caused it: ``mayor``, ``operator:<name>``, ``polecat:<rig>/<name>``, ..."""
    causation_id: str | None = None
    """The command or event that caused this one."""
    correlation_id: str | None = None
    """Ties together everything one operator action set off."""
    data: msgspec.Raw
    """The payload, decoded in a second step by ``type``."""


class Event(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Base of every payload. ``TYPE`` is the stable tag stored in the envelope; ``AGGREGATE`` names the subject."""

    TYPE: ClassVar[str] = ""
    AGGREGATE: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1

    def aggregate_id(self) -> str:
        """The id that, with ``AGGREGATE``, names the event's subject."""
        raise NotImplementedError

    def subject(self) -> str:
        """Where the event is stored: ``gt.evt.<aggregate>.<id>``."""
        return subjects.event_subject(self.AGGREGATE, self.aggregate_id())


class EventRef(msgspec.Struct, frozen=True, kw_only=True):
    """Names a stored event from another one (a command outcome lists the events it produced)."""

    id: str
    type: str
    subject: str


Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


class EventRegistry:
    """Type tag -> payload class, with decoders built once and an upcaster chain for old versions."""

    def __init__(self, classes: Iterable[type[Event]] = ()) -> None:
        self._classes: dict[str, type[Event]] = {}
        self._decoders: dict[str, msgspec.json.Decoder[Any]] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        for cls in classes:
            self.register(cls)

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
        """The typed payload of ``env``.

        Raises:
            UnknownEventTypeError: the type, or this version of it, is not known here.
            EventDecodeError: the payload does not match its type's schema.
        """
        cls = self._classes.get(env.type)
        if cls is None or env.v > cls.VERSION:
            raise UnknownEventTypeError(env.type, env.v)
        try:
            if env.v == cls.VERSION:
                payload: Event = self._decoders[env.type].decode(env.data)
                return payload
            data: dict[str, Any] = msgspec.json.decode(env.data)
            for version in range(env.v, cls.VERSION):
                upcast = self._upcasters.get((env.type, version))
                if upcast is None:
                    raise EventDecodeError(f"no upcaster for {env.type} v{version}")
                data = upcast(data)
            converted: Event = msgspec.convert(data, cls)
        except UNDECODABLE as exc:
            raise EventDecodeError(f"{env.type} v{env.v}: {exc!r:.300}") from exc
        return converted


_ENVELOPE_DECODER = msgspec.json.Decoder(Envelope)
_ENCODER = msgspec.json.Encoder()


def decode_envelope(raw: bytes | memoryview) -> Envelope:
    """Step one of decoding: the envelope, with the payload left raw."""
    try:
        return _ENVELOPE_DECODER.decode(raw)
    except UNDECODABLE as exc:
        raise EventDecodeError(f"{exc!r:.300}") from exc


def encode_event(
    payload: Event,
    *,
    event_id: str,
    ts: datetime,
    actor: str,
    causation_id: str | None = None,
    correlation_id: str | None = None,
) -> bytes:
    """The bytes stored for ``payload``: an envelope with the payload inline."""
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
