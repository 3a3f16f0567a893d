"""Settling one command: its outcome looked for first (a redelivery), its fence checked, then decide and append
its events and its outcome in one atomic batch, deciding again on a fresher projection when the log moved under
it. The outcome (``gt.evt.cmd.<id>``, expected sequence 0) makes a second outcome, or a second effect, impossible."""

from __future__ import annotations

import contextlib
from datetime import datetime

import structlog

from shared.bus import streams
from shared.bus.append import ERR_MAX_PAYLOAD, Appender, PendingEvent
from shared.bus.commit import GroupCommitter
from shared.bus.connection import Connection
from shared.bus.errors import BusError
from shared.bus.fencing import fence_error
from shared.core import ids, subjects
from shared.core.aio import pause
from shared.core.errors import (
    STORAGE_FULL_HINT,
    AppendConflictError,
    AppendFailedError,
    AppendTimeoutError,
    CommandError,
)
from shared.model.commands import Command
from shared.model.decision import Accepted, DecideContext, NewEvent
from shared.model.events import CommandAccepted, CommandRejected, EventRef, encode_event
from shared.service.follower import Follower
from shared.service.intake.delivery import Delivery
from shared.service.intake.handler import CommandHandler

log = structlog.get_logger(__name__)

MAX_DECIDE_ATTEMPTS = 20


class Settler:
    """Ends commands in their outcome, one call of ``settle`` per command."""

    def __init__(
        self,
        *,
        service: str,
        handler: CommandHandler,
        nc: Connection,
        appender: Appender,
        committer: GroupCommitter,
        reader: Follower,
    ) -> None:
        self._service = service
        self._handler = handler
        self._nc = nc
        self._appender = appender
        self._committer = committer
        self._reader = reader
        self.committed_high = 0
        """The last stream sequence this intake appended: later commands are decided on a projection holding it."""
        self.rejected = 0
        self.duplicates = 0

    async def settled_before(self, delivery: Delivery) -> bool:
        return await self._stored_outcome(delivery.command_id) is not None

    async def _stored_outcome(self, command_id: str) -> tuple[int, bytes] | None:
        for subject in subjects.outcome_subjects(command_id):
            if (stored := await self._appender.last_on_subject(subject)) is not None:
                return stored
        return None

    async def settle(self, delivery: Delivery, parsed: Command | CommandError) -> int:
        """Store the command's events and outcome (or find its outcome stored); returns the outcome's sequence."""
        outcome_subject = subjects.outcome_subject(delivery.command_id)
        if delivery.delivered > 1 or delivery.held:
            stored = await self._stored_outcome(delivery.command_id)
            if stored is not None:
                self.duplicates += 1
                log.info("command_already_settled", outcome_seq=stored[0])
                return stored[0]
        if isinstance(parsed, Command) and parsed.fence is not None:
            holder = delivery.origin.session if isinstance(delivery.origin, subjects.SessionOrigin) else None
            fenced = await fence_error(
                self._nc, self._reader.stream, parsed.fence, stored_at=delivery.stored_time(), holder=holder
            )
            if fenced is not None:
                parsed = fenced
        facts = await self._handler.prepare(parsed) if isinstance(parsed, Command) else None
        caught_up = False
        for attempt in range(MAX_DECIDE_ATTEMPTS + 1):
            if attempt == MAX_DECIDE_ATTEMPTS:
                parsed = CommandError("conflict", "the aggregate kept changing under the command; send it again")
            pending, rejected = self.events_for(delivery, parsed, facts)
            if rejected == "not_found" and not caught_up and isinstance(parsed, Command):
                # It may name what this service created a moment ago, whose outcome its sender has already
                # read while this projection has not applied it yet: judge it on the log as it is now.
                caught_up = True
                await self.catch_up()
                continue
            try:
                seqs = await self._committer.append(pending)
            except ValueError as exc:
                # More events than one atomic append can hold: the command is too big to carry out at once.
                parsed = CommandError("too_large", f"the command would produce too many events at once: {exc}")
                continue
            except AppendConflictError as exc:
                stored = await self._stored_outcome(delivery.command_id)
                if stored is not None:
                    self.duplicates += 1
                    log.info("command_already_settled", outcome_seq=stored[0])
                    return stored[0]
                # Someone else moved an aggregate first: decide again on a projection that has it.
                log.info("command_conflict_retry", subject=exc.subject, actual=exc.actual)
                await self.catch_up()
                continue
            except AppendFailedError as exc:
                if exc.storage_full:
                    # Not the command's fault: the town is full. It waits in GT_CMD (redelivered, never set aside)
                    # and is carried out once space is back; nothing stored is touched.
                    log.error(
                        "log_storage_full",
                        subject=exc.subject,
                        error=exc.description,
                        err_code=exc.err_code,
                        hint=STORAGE_FULL_HINT,
                    )
                    raise
                if isinstance(parsed, CommandError):
                    raise  # not even the rejection can be stored: leave the command for redelivery
                code = "too_large" if exc.err_code == ERR_MAX_PAYLOAD else "invalid"
                parsed = CommandError(code, f"the log refused the command's events: {exc.description}")
                continue
            self.committed_high = max(self.committed_high, seqs[-1])
            if rejected:
                self.rejected += 1
            return seqs[-1]
        raise AppendTimeoutError(outcome_subject, MAX_DECIDE_ATTEMPTS + 1)

    async def catch_up(self) -> None:
        """Wait until the projection holds everything stored now (a short pause when the server cannot say)."""
        try:
            last = await streams.last_seq(self._nc, self._reader.stream)
        except (TimeoutError, BusError):
            await pause(0.2)
            return
        with contextlib.suppress(TimeoutError):
            await self._reader.wait_for_seq(last, timeout=10)

    def events_for(
        self, delivery: Delivery, parsed: Command | CommandError, facts: object = None
    ) -> tuple[list[PendingEvent], str | None]:
        """Decide (again) and encode the command's events followed by its outcome, and the rejection's reason
        code (None when accepted)."""
        now = self._handler.now()
        accepted: Accepted | None = None
        rejection = parsed if isinstance(parsed, CommandError) else None
        if isinstance(parsed, Command):
            ctx = DecideContext(
                now=now,
                command_id=delivery.command_id,
                actor=delivery.actor,
                new_id=self._handler.new_id,
                facts=facts,
            )
            try:
                accepted = self._handler.decide(parsed, ctx)
            except CommandError as exc:
                rejection = exc
            except Exception as exc:
                log.exception("decide_failed", error=repr(exc))
                rejection = CommandError(
                    "invalid", f"the {self._service} could not process this command ({type(exc).__name__}); see its log"
                )
        pending: list[PendingEvent] = []
        outcome: CommandAccepted | CommandRejected
        if accepted is not None:
            refs: list[EventRef] = []
            for new in accepted.events:
                event = to_pending(
                    new,
                    ts=now,
                    actor=delivery.actor,
                    causation_id=delivery.command_id,
                    correlation_id=delivery.correlation_id,
                )
                pending.append(event)
                refs.append(EventRef(id=event.event_id, type=new.payload.TYPE, subject=event.subject))
            outcome = CommandAccepted(
                command_id=delivery.command_id, command=delivery.name, events=refs, result=accepted.result
            )
        else:
            assert rejection is not None
            log.info("command_rejected", code=rejection.code, reason=rejection.message)
            outcome = CommandRejected(
                command_id=delivery.command_id, command=delivery.name, code=rejection.code, message=rejection.message
            )
        pending.append(
            to_pending(
                NewEvent(payload=outcome, expected_seq=0),  # the first and only outcome of this command
                ts=now,
                actor=self._service,
                causation_id=delivery.command_id,
                correlation_id=delivery.correlation_id,
            )
        )
        return pending, rejection.code if accepted is None and rejection is not None else None


def to_pending(
    new: NewEvent, *, ts: datetime, actor: str, causation_id: str | None, correlation_id: str | None
) -> PendingEvent:
    """A decided event, encoded in its envelope and ready to append to its aggregate's subject."""
    event_id = ids.new_event_id()
    data = encode_event(
        new.payload, event_id=event_id, ts=ts, actor=actor, causation_id=causation_id, correlation_id=correlation_id
    )
    return PendingEvent(subject=new.payload.subject(), data=data, event_id=event_id, expected_seq=new.expected_seq)
