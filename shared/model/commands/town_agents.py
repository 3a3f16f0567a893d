"""Town agent commands (``gt.cmd.agent.<verb>``): the mayor agent, an AI session the operator talks to, settled by
the witness, which supervises it (docs/mayor-agent.md)."""

from __future__ import annotations

from typing import ClassVar

from shared.core import subjects
from shared.model.commands.base import Command, check_text, check_typeable, invalid
from shared.model.results import TownAgentResult

MAX_ASK = 8 * 1024
"""The longest request typed into the mayor agent's pane."""


class _TownAgentCommand(Command[TownAgentResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    OWNER: ClassVar[str] = "witness"
    ORDERED_BY = ("agent", "name")
    name: str = "mayor"
    """Which town agent (``subjects.TOWN_AGENTS``)."""

    def validate(self) -> None:
        super().validate()
        if self.name not in subjects.TOWN_AGENTS:
            raise invalid(f"`name` {self.name[:80]!r} is no town agent (one of: {', '.join(subjects.TOWN_AGENTS)})")


class TownAgentStart(_TownAgentCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Run the town agent from now on: the witness starts its session, and restarts it whenever it dies, until
    ``agent.stop``. Starting a running agent changes nothing (its runtime stays)."""

    SUBJECT: ClassVar[str] = "gt.cmd.agent.start"
    agent: str = ""
    """The runtime it runs, as a rig's ``agent_command`` (``claude``, ``codex``, ...); empty: ``claude``."""

    def validate(self) -> None:
        super().validate()
        check_text("agent", self.agent, 1000)


class TownAgentStop(_TownAgentCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Stop the town agent: its session is ended and not restarted. Its requests not yet answered are dropped."""

    SUBJECT: ClassVar[str] = "gt.cmd.agent.stop"


class TownAgentAsk(_TownAgentCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A request for the town agent, typed into its session when it is at its prompt (queued while it works or
    restarts); its answer is recorded (``town_agent.answered``) when its turn ends."""

    SUBJECT: ClassVar[str] = "gt.cmd.agent.ask"
    text: str

    def validate(self) -> None:
        super().validate()
        check_text("text", self.text, MAX_ASK, nonblank=True)
        check_typeable("text", self.text)


TOWN_AGENT_COMMANDS: tuple[type[Command[TownAgentResult]], ...] = (TownAgentStart, TownAgentStop, TownAgentAsk)
