"""Commands that keep failing: a bug a command triggers is retried a few times, then the command is set aside
(rejected ``set_aside``, escalated, acknowledged), never retried forever; a failure of the server or the
connection is not the command's and never sets it aside."""

from __future__ import annotations

import os

import structlog

from shared.bus import commands as bus_commands
from shared.bus import consumer as bus_consumer
from shared.bus.connection import Connection
from shared.bus.errors import BusError
from shared.core import ids, subjects
from shared.core.errors import (
    CommandError,
    GastownError,
)
from shared.model.commands import EscalationRaise
from shared.service.intake.delivery import Delivery

log = structlog.get_logger(__name__)

MAX_FAILURES_ENV = "GT_CMD_MAX_DELIVER_CRASHES"
DEFAULT_MAX_FAILURES = 5
"""Attempts at settling one command that failed (its processing raised, or the service died on it) after which
it is set aside: rejected with ``set_aside``, escalated, acknowledged; never retried forever."""
RETRY_FAILED_AFTER_S = 1.0


def max_failures_from_env() -> int:
    """``GT_CMD_MAX_DELIVER_CRASHES`` (at least 1; default ``DEFAULT_MAX_FAILURES``)."""
    raw = os.environ.get(MAX_FAILURES_ENV, "")
    return max(1, int(raw)) if raw.strip().isdigit() else DEFAULT_MAX_FAILURES


class Poison:
    """Counts the failures of the commands one intake settles and sets aside those that keep failing."""

    def __init__(
        self,
        *,
        service: str,
        identity: str,
        nc: Connection,
        stream: str,
        evt_stream: str,
        max_failures: int,
        counts_deliveries: bool,
    ) -> None:
        self._service = service
        self._identity = identity
        self._nc = nc
        self._stream = stream
        self._evt_stream = evt_stream
        self.max_failures = max_failures
        self._counts_deliveries = counts_deliveries
        """False where instances hand each other's commands back (a routed service): each pass is a delivery."""
        self._failures: dict[int, int] = {}
        """Stream sequence -> attempts at settling it that raised in this instance."""
        self._infra_failures: dict[int, int] = {}
        """Stream sequence -> deliveries this instance left unsettled because the server failed (not counted
        as the command's failures)."""
        self.set_aside = 0
        """Commands set aside after failing ``max_failures`` times (rejected ``set_aside`` and escalated)."""

    def crashes(self, delivery: Delivery) -> int:
        """Earlier deliveries of the command that settled nothing and that this instance did not see fail on the
        server: the instances it went to died on it (a crash loop). Not counted where instances hand each
        other's commands back (a routed service: each pass is a delivery too), nor for a command read from the
        stream (its deliveries are unknown there): only failures seen in the process count then."""
        if delivery.msg is None or not self._counts_deliveries:
            return 0
        return max(0, delivery.delivered - 1 - self._infra_failures.get(delivery.stream_seq, 0))

    def count_infra_failure(self, delivery: Delivery) -> None:
        self._infra_failures[delivery.stream_seq] = self._infra_failures.get(delivery.stream_seq, 0) + 1

    def forget(self, delivery: Delivery) -> None:
        """The command is settled: its failures no longer matter."""
        self._failures.pop(delivery.stream_seq, None)
        self._infra_failures.pop(delivery.stream_seq, None)

    def set_aside_error(self, why: str) -> CommandError:
        log.error("command_set_aside", why=why)
        self.set_aside += 1
        return CommandError(
            "set_aside",
            f"the {self._service} set this command aside: {why}. It was not carried out; an escalation was raised. "
            "Fix the command (or report the bug) and send it again under a new id",
        )

    async def after_failure(self, delivery: Delivery, exc: Exception) -> CommandError | None:
        """A bug the command triggered while it was processed: retried a few times (the next delivery, soon),
        then set aside. Returns the ``set_aside`` rejection to settle it with, or None (retried later)."""
        failures = self._failures.get(delivery.stream_seq, 0) + 1
        self._failures[delivery.stream_seq] = failures
        log.error("command_failed", error=repr(exc), failures=failures, delivered=delivery.delivered, exc_info=exc)
        if max(failures, self.crashes(delivery) + 1) < self.max_failures:
            if delivery.msg is not None:
                await bus_consumer.nak(delivery.msg, RETRY_FAILED_AFTER_S * failures)
            return None  # held from a predecessor: its redelivery by the consumer comes after the ack wait
        await self.escalate(delivery, exc)
        return self.set_aside_error(f"settling it failed {failures} times ({type(exc).__name__}: {exc!s:.200})")

    async def escalate(self, delivery: Delivery, exc: Exception | None) -> None:
        """Tell a person (an escalation to the mayor) before the rejection is stored: its id makes a repeat
        harmless, and a rejection stored first could leave the escalation unsent after a crash."""
        what = f"{type(exc).__name__}: {exc!s:.200}" if exc is not None else "the service stopped on it"
        cmd_id = ids.command_id(f"set-aside-{delivery.command_id}", None, 0)
        raise_cmd = EscalationRaise(
            cmd_id=cmd_id,
            severity="high",
            message=f"the {self._service} set command {delivery.command_id} ({delivery.name}) aside: {what}",
            source=self._identity,
        )
        origin = subjects.ServiceOrigin(self._identity)
        try:
            # One attempt: the rejection is stored next either way (a person learns of it there too).
            await bus_commands.store(
                self._nc, self._stream, raise_cmd, evt_stream=self._evt_stream, origin=origin, deadline_s=0
            )
        except (TimeoutError, BusError, GastownError) as exc_pub:
            log.warning("set_aside_escalation_failed", error=repr(exc_pub))
