"""Projection base: a pure fold over the log that records the last sequence applied.

The fold itself (``fold(payload, state, envelope, seq)``, a ``functools.singledispatch`` registered per
payload type) does no I/O and reads no clock. This class feeds it decoded events in order, skips any
sequence at or below ``last_seq``, logs and skips event types it does not know, and turns the state into
snapshots (state + sequence + schema fingerprint + the stream's identity) and back.

A handler's common shape: look the aggregate up with ``touch`` (which moves its version to the event's
sequence) or, for an event that moves it to another status, ``advance``; do nothing when the projection does not
know it; then change what the event changes.
"""

from __future__ import annotations

import gc
import hashlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec
import structlog

from shared.core import subjects
from shared.core.errors import EventLogLostError, GastownError
from shared.model.events import REGISTRY, Envelope, Event, EventRegistry, decode_envelope

log = structlog.get_logger(__name__)

S = TypeVar("S", bound=msgspec.Struct)
Fold = Callable[[Event, Any, Envelope, int], None]


class _Snapshot(msgspec.Struct, frozen=True):
    fingerprint: str
    stream_id: str
    """Identifies the stream the snapshot was taken from (its creation time): a recreated stream with the
    same name must not be read through an old snapshot."""
    last_seq: int
    state: msgspec.Raw


_SNAPSHOT_DECODER = msgspec.msgpack.Decoder(_Snapshot)
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
        snapshot_after: frozenset[str] = frozenset(),
    ) -> None:
        self.name = name
        self.snapshot_after = snapshot_after
        """Event types after which a snapshot is due at once (a garbage collection sweep shrinks the state: the
        stored snapshot is replaced by the compacted one without waiting for ``snapshot_every`` events)."""
        self.snapshot_due = False
        """Set when an event of ``snapshot_after`` was applied; the service clears it when it stores a snapshot."""
        self.state_type = state_type
        self.state: S = state_type()
        self.last_seq = 0
        self.applied = 0
        """Events folded into the state by this process (not counting a snapshot's)."""
        self.skipped = 0
        """Events skipped because their type is unknown or they do not decode."""
        self.fold_errors = 0
        """Events whose fold raised (a bug): logged and skipped; a replay skips them the same way."""
        self._fold = fold
        # singledispatch looks the handler up on every call; resolving it once per payload type saves a
        # good part of the fold's cost on a million-event replay.
        dispatch = getattr(fold, "dispatch", None)
        self._handlers: dict[type[Event], Fold] = {}
        self._subjects: dict[type[Event], str] = {}
        """Per payload type, the prefix of its aggregate's subjects (``gt.evt.<aggregate>.``)."""
        self._resolve: Callable[[type[Event]], Fold] = dispatch if dispatch is not None else (lambda _cls: fold)
        self._registry = registry
        self._state_decoder = msgspec.msgpack.Decoder(state_type)
        schema = msgspec.json.encode(msgspec.json.schema(state_type))
        self.fingerprint = hashlib.sha256(f"{name}:{schema_version}:".encode() + schema).hexdigest()[:32]
        self._reported: set[str] = set()

    def apply(self, seq: int, subject: str, data: bytes) -> None:
        """Fold the event stored at ``seq``. Never raises for bad or unknown events: they are logged and skipped."""
        if seq <= self.last_seq:
            return
        try:
            env = decode_envelope(data)
            payload = self._registry.decode_payload(env)
        except GastownError as exc:
            self.skipped += 1
            self.last_seq = seq
            kind = getattr(exc, "type", None) or type(exc).__name__
            if kind not in self._reported:
                # Once per kind: a newer writer may store thousands of a type this code does not know yet.
                self._reported.add(kind)
                log.warning("event_skipped", projection=self.name, seq=seq, subject=subject, reason=str(exc))
            return
        cls = type(payload)
        handler = self._handlers.get(cls)
        if handler is None:
            handler = self._handlers[cls] = self._resolve(cls)
            self._subjects[cls] = subjects.event_subject(cls.AGGREGATE, "")
        if not subject.startswith(self._subjects[cls]):
            # An event is its aggregate's only on that aggregate's subjects, the only ones its writer may append
            # to: a gate runner may append only to ``gt.evt.gate.>``, and an ``mr.merged`` it stored there is no
            # merge (NATS permissions name subjects, never what a message says it is).
            self.skipped += 1
            self.last_seq = seq
            if f"misplaced:{env.type}" not in self._reported:
                self._reported.add(f"misplaced:{env.type}")
                log.warning("event_misplaced", projection=self.name, seq=seq, subject=subject, type=env.type)
            return
        try:
            handler(payload, self.state, env, seq)
        except Exception:
            self.fold_errors += 1
            log.exception("event_fold_failed", projection=self.name, seq=seq, type=env.type, event_id=env.id)
        self.last_seq = seq
        self.applied += 1
        if env.type in self.snapshot_after:
            self.snapshot_due = True

    def skip_to(self, seq: int) -> None:
        """Nothing stored up to ``seq`` is for this projection: a reader of only the subjects it folds
        (``shared.bus.direct_reader``) read the log that far. ``last_seq`` moves there, as if every event up to it had
        been applied and found of no concern."""
        self.last_seq = max(self.last_seq, seq)

    def serialize_state(self) -> bytes:
        """Canonical JSON of the state and sequence: two projections are equal when these bytes are."""
        return _JSON.encode({"last_seq": self.last_seq, "state": self.state})

    def snapshot(self, stream_id: str) -> bytes:
        """The projection as bytes that ``restore`` accepts (msgpack)."""
        return _MSGPACK.encode(
            _Snapshot(self.fingerprint, stream_id, self.last_seq, msgspec.Raw(_MSGPACK.encode(self.state)))
        )

    def restore(self, data: bytes, *, stream_id: str, stream_last_seq: int) -> bool:
        """Load a snapshot taken from the stream ``stream_id``; False (state untouched) when it is unusable: it
        does not decode, or its fingerprint (state schema) differs.

        Raises:
            EventLogLostError: the snapshot comes from another stream of the log's name, or covers more of it
                than the stream holds: the log is not this town's any more (its stream name left empty: the
                caller knows it).
        """
        try:
            snap = _SNAPSHOT_DECODER.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("snapshot_ignored", projection=self.name, reason="undecodable", error=str(exc))
            return False
        reason = None
        if snap.fingerprint != self.fingerprint:
            reason = "schema_fingerprint_differs"
        elif snap.stream_id != stream_id:
            # The log is another stream than the one this town's snapshot was taken of: the town's own was lost.
            raise EventLogLostError(
                "", f"it is not the stream the {self.name}'s snapshot was taken of (created {snap.stream_id})"
            )
        elif snap.last_seq > stream_last_seq:
            raise EventLogLostError(
                "",
                f"it holds {stream_last_seq} events, fewer than the {snap.last_seq} the {self.name}'s snapshot covers",
            )
        if reason is not None:
            log.warning("snapshot_ignored", projection=self.name, reason=reason, snapshot_seq=snap.last_seq)
            return False
        # Decoding builds millions of small objects; the cyclic GC would rescan them again and again
        # while they are being made (it tripled restore time), and none of them is garbage yet.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            state = self._state_decoder.decode(snap.state)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("snapshot_ignored", projection=self.name, reason="undecodable_state", error=str(exc))
            return False
        else:
            # The collector counted every container made meanwhile: enabled again, its next allocation would
            # scan all of them (0.12 s of a 1,000,000-event town's start). The state holds no cycles, so it is
            # set aside (gc.freeze, as the service does once ready: runtime.settle_heap) and still freed by
            # reference counting when replaced.
            gc.freeze()
        finally:
            if gc_was_enabled:
                gc.enable()
        self.state = state
        self.last_seq = snap.last_seq
        return True
