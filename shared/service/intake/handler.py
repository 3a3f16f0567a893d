"""What the intake asks of the service whose commands it settles: one protocol, which ``shared.service.Service``
implements, in place of a callable per question."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from shared.model.commands import Command
from shared.model.decision import Accepted, DecideContext, Route


class CommandHandler(Protocol):
    """The service side of settling a command. Which commands are decided in order, and which service owns a
    subject, the commands say themselves (``Command.ordering_key``, ``Command.OWNER``)."""

    @property
    def routes_commands(self) -> bool:
        """Whether instances with disjoint scopes share the command consumer and hand each other commands
        (``route`` is asked then; the witness). Such deliveries do not count towards setting a command aside."""
        ...

    def decide(self, cmd: Command, ctx: DecideContext) -> Accepted:
        """Turn a command into events, or raise ``CommandError``. Pure: reads only the projection."""
        ...

    async def prepare(self, cmd: Command) -> object:
        """Observe what deciding ``cmd`` needs from outside the log (I/O allowed): ``DecideContext.facts``."""
        ...

    def route(self, cmd: Command) -> Route:
        """Which scope settles ``cmd``: this one, another one, or none known yet."""
        ...

    def now(self) -> datetime:
        """The time decisions and the events stored are stamped with."""
        ...

    def new_id(self, prefix: str) -> str:
        """A fresh id for what a command creates when its sender chose none."""
        ...
