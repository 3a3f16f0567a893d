"""An in-memory event log with JetStream's per-subject concurrency check, for unit tests of pure logic.

It stores encoded envelopes exactly as the real log does, so projections fold the same bytes; only the
transport is missing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

import msgspec
import pytest

from shared.core import subjects
from shared.core.errors import AppendConflictError, CommandError
from shared.model.commands import Command, parse_command
from shared.model.decision import Accepted, DecideContext, NewEvent
from shared.model.events import Event, encode_event
from shared.service.projection import Projection

S = TypeVar("S", bound=msgspec.Struct)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class MemoryLog:
    """Append-only list of (seq, subject, data) with ``expected_seq`` checks, atomic per append."""

    def __init__(self) -> None:
        self.messages: list[tuple[int, str, bytes]] = []
        self._last: dict[str, int] = {}

    @property
    def last_seq(self) -> int:
        return len(self.messages)

    def append(self, events: list[tuple[str, bytes, int | None]]) -> list[int]:
        for subject, _, expected in events:
            if expected is not None and self._last.get(subject, 0) != expected:
                raise AppendConflictError(subject, expected, self._last.get(subject, 0))
        seqs = []
        for subject, data, _ in events:
            seq = len(self.messages) + 1
            self.messages.append((seq, subject, data))
            self._last[subject] = seq
            seqs.append(seq)
        return seqs

    def record(self, events: Iterable[Event], *, ts: datetime, actor: str = "test") -> None:
        """Append events as a service stored them (no concurrency check), each on its aggregate's subject."""
        for event in events:
            subject = subjects.event_subject(event.AGGREGATE, event.aggregate_id())
            data = encode_event(event, event_id=f"ev-{self.last_seq + 1}", ts=ts, actor=actor)
            self.append([(subject, data, None)])

    def replay(self, projection: Projection[Any], after: int = 0) -> None:
        for seq, subject, data in self.messages[after:]:
            projection.apply(seq, subject, data)


class Fed(Generic[S]):
    """A projection fed events directly, stamped with a clock the test moves."""

    def __init__(self, projection: Projection[S], *, clock: datetime = T0) -> None:
        self.projection = projection
        self.log = MemoryLog()
        self.clock = clock

    @property
    def state(self) -> S:
        return self.projection.state

    def add(self, *events: Event, at: datetime | None = None) -> None:
        """Store ``events`` (at the clock, or ``at``) and fold them."""
        self.log.record(events, ts=self.clock if at is None else at)
        self.log.replay(self.projection, after=self.projection.last_seq)

    def tick(self, seconds: float = 1.0) -> None:
        self.clock += timedelta(seconds=seconds)


class MemoryTown(Fed[S]):
    """Runs commands through a service's pure decide function and folds the result, like the intake does."""

    def __init__(
        self,
        projection: Projection[S],
        decide: Callable[[S, Command, DecideContext], Accepted],
        *,
        service: str = "mayor",
        reconcile: Callable[[S, datetime], list[NewEvent]] | None = None,
    ) -> None:
        super().__init__(projection)
        self._decide = decide
        self._service = service
        self._reconcile = reconcile
        self._ids = itertools.count(1)
        self._cmd_ids = itertools.count(1)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids):06d}"

    def send(self, subject: str, body: dict[str, Any] | bytes, *, actor: str = "operator") -> dict[str, Any]:
        """Parse, decide, append and fold; returns the result, or raises CommandError as the intake would answer."""
        raw = body if isinstance(body, bytes) else msgspec.json.encode(body)
        cmd = parse_command(subject, raw)
        command_id = f"cmd-{next(self._cmd_ids)}"
        ctx = DecideContext(now=self.clock, command_id=command_id, actor=actor, new_id=self.new_id)
        accepted = self._decide(self.projection.state, cmd, ctx)
        self._store(accepted.events, actor)
        self.reconcile()
        result: dict[str, Any] = msgspec.to_builtins(accepted.result)  # as the outcome carries it
        return result

    def _store(self, new_events: list[NewEvent], actor: str) -> None:
        events: list[tuple[str, bytes, int | None]] = []
        for new in new_events:
            subject = subjects.event_subject(new.payload.AGGREGATE, new.payload.aggregate_id())
            event_id = f"ev-{self.log.last_seq + len(events) + 1}"
            events.append(
                (subject, encode_event(new.payload, event_id=event_id, ts=self.clock, actor=actor), new.expected_seq)
            )
        self.log.append(events)
        self.log.replay(self.projection, after=self.projection.last_seq)

    def reconcile(self) -> int:
        """Store what the service owes by itself (as its reconcile would), until nothing is owed."""
        stored = 0
        while self._reconcile is not None:
            owed = self._reconcile(self.projection.state, self.clock)
            if not owed:
                break
            for new in owed:
                self._store([new], self._service)
                stored += 1
        return stored

    def reject_code(self, subject: str, body: dict[str, Any]) -> str:
        try:
            self.send(subject, body)
        except CommandError as exc:
            return exc.code
        raise AssertionError(f"{subject} {body} was accepted")


class Deciding(Fed[Any]):
    """A projection fed events directly, and commands decided against it (by ``decide``, a service's pure decide
    function) and folded back."""

    def __init__(self, projection: Projection[Any], decide: Any, *, clock: datetime = T0) -> None:
        super().__init__(projection, clock=clock)
        self.decide = decide
        self._ids = itertools.count(1)

    def send(self, subject: str, /, facts: object = None, *, sender: str = "operator", **body: Any) -> dict[str, Any]:
        """``sender``: whom the intake recorded as its actor (from its subject)."""
        cmd = parse_command(subject, msgspec.json.encode(body))
        ctx = DecideContext(
            now=self.clock, command_id="c-1", actor=sender, new_id=lambda p: f"{p}-{next(self._ids)}", facts=facts
        )
        accepted: Accepted = self.decide(self.projection.state, cmd, ctx)
        for new in accepted.events:
            self.add(new.payload)
        result: dict[str, Any] = msgspec.to_builtins(accepted.result)  # as the outcome carries it
        return result

    def reject(self, subject: str, /, facts: object = None, *, sender: str = "operator", **body: Any) -> CommandError:
        with pytest.raises(CommandError) as caught:
            self.send(subject, facts, sender=sender, **body)
        return caught.value
