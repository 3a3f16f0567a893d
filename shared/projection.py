"""Projection base: a pure fold over the log that records the last sequence applied.

The fold itself (``fold(payload, state, envelope, seq)``, a ``functools.singledispatch`` registered per
payload type) does no I/O and reads no clock. This class feeds it decoded events in order, skips any
sequence at or below ``last_seq``, logs and skips event types it does not know, and turns the state into
snapshots (state + sequence + schema fingerprint) and back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec
import structlog

from shared.events import REGISTRY, Envelope, Event, EventRegistry, decode_envelope
from shared.errors import GastownError

log = structlog.get_logger(__name__)

S = TypeVar("S", bound=msgspec.Struct)
Fold = Callable[[Event, Any, Envelope, int], None]


class _SnapshotHeader(msgspec.Struct, frozen=True):
    fingerprint: str
    last_seq: int
    state: msgspec.Raw


_HEADER_DECODER = msgspec.msgpack.Decoder(_SnapshotHeader)
_MSGPACK = msgspec.msgpack.Encoder()
_JSON = msgspec.json.Encoder(order="deterministic")


class Projection(Generic[S]):
    """Holds ``state`` of type ``S`` and folds stored events into it."""

    def __init__(
        self,
        name: str,
        state_type: type[S],
        fold: Fold,
        *,
        schema_version: int,
        registry: EventRegistry = REGISTRY,
    ) -> None:
        self.name = name
        self.state_type = state_type
        self.state: S = state_type()
        self.last_seq = 0
        self.applied = 0
        self.skipped = 0
        self._fold = fold
        self._registry = registry
        self._state_decoder = msgspec.msgpack.Decoder(state_type)
        schema = msgspec.json.encode(msgspec.json.schema(state_type))
        self.fingerprint = hashlib.sha256(f"{name}:{schema_version}:".encode() + schema).hexdigest()[:32]
        self._unknown_types: set[str] = set()

    def apply(self, seq: int, subject: str, data: bytes) -> None:
        """Fold the event stored at ``seq``. Never raises for bad or unknown events: they are logged and skipped."""
        if seq <= self.last_seq:
            return
        try:
            env = decode_envelope(data)
            payload = self._registry.decode_payload(env)
        except GastownError as exc:
            self.skipped += 1
            key = getattr(exc, "type", None) or type(exc).__name__
            if key not in self._unknown_types:
                self._unknown_types.add(key)
                log.warning("event_skipped", projection=self.name, seq=seq, subject=subject, reason=str(exc))
            self.last_seq = seq
            return
        self._fold(payload, self.state, env, seq)
        self.last_seq = seq
        self.applied += 1

    def serialize_state(self) -> bytes:
        """Canonical JSON of the state and sequence: two projections are equal when these bytes are."""
        return _JSON.encode({"last_seq": self.last_seq, "state": self.state})

    def snapshot(self) -> bytes:
        return _MSGPACK.encode(
            _SnapshotHeader(self.fingerprint, self.last_seq, msgspec.Raw(_MSGPACK.encode(self.state)))
        )

    def restore(self, data: bytes) -> bool:
        """Load a snapshot; False (state untouched) when it does not decode or its fingerprint differs."""
        try:
            header = _HEADER_DECODER.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("snapshot_ignored", projection=self.name, reason="undecodable", error=str(exc))
            return False
        if header.fingerprint != self.fingerprint:
            log.warning(
                "snapshot_ignored", projection=self.name, reason="fingerprint", have=header.fingerprint, want=self.fingerprint
            )
            return False
        try:
            state = self._state_decoder.decode(header.state)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("snapshot_ignored", projection=self.name, reason="undecodable_state", error=str(exc))
            return False
        self.state = state
        self.last_seq = header.last_seq
        return True
