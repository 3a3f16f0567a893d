"""Events of the town agent aggregate (``gt.evt.agent.<name>``): the mayor agent's session, written by the witness
that supervises it (docs/mayor-agent.md)."""

from __future__ import annotations

from typing import ClassVar

from shared.model.events.base import Event


class TownAgentEvent(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "agent"
    name: str

    def aggregate_id(self) -> str:
        return self.name


class TownAgentStarted(TownAgentEvent, frozen=True, kw_only=True):
    """The operator wants the agent running (``gt mayor start``): the witness keeps a session of it alive."""

    TYPE: ClassVar[str] = "town_agent.started"
    agent: str
    """The runtime it runs (a rig's ``agent_command``)."""


class TownAgentStopped(TownAgentEvent, frozen=True, kw_only=True):
    """The operator stopped it (``gt mayor stop``): its session is ended and not restarted."""

    TYPE: ClassVar[str] = "town_agent.stopped"


class TownAgentLaunched(TownAgentEvent, frozen=True, kw_only=True):
    """A session of the agent was launched (``run``: the how-manyth since it was started). A request delivered to
    the run before and not answered is delivered again to this one (its conversation is new)."""

    TYPE: ClassVar[str] = "town_agent.launched"
    run: int
    tmux_name: str
    pane_pid: int
    pid_started: float = 0.0


class TownAgentAsked(TownAgentEvent, frozen=True, kw_only=True):
    """A request for the agent (``gt mayor ask``), queued until the agent is at its prompt."""

    TYPE: ClassVar[str] = "town_agent.asked"
    ask_id: str
    text: str
    asked_by: str


class TownAgentAskDelivered(TownAgentEvent, frozen=True, kw_only=True):
    """The request was typed into the agent's session (run ``run``) and sent."""

    TYPE: ClassVar[str] = "town_agent.ask_delivered"
    ask_id: str
    run: int
    transcript: str = ""
    """The runtime's newest transcript when it was typed (relative to its runtime dir; empty: none yet)."""
    offset: int = 0
    """Where that transcript ended then: its answer is read from there on (``transcripts.answer_to``)."""


class TownAgentAnswered(TownAgentEvent, frozen=True, kw_only=True):
    """The agent ended the turn the request began: its last words, from its runtime's transcript."""

    TYPE: ClassVar[str] = "town_agent.answered"
    ask_id: str
    text: str


class TownAgentTold(TownAgentEvent, frozen=True, kw_only=True):
    """A notice was typed into the agent's session while it waited at its prompt: mail to it (``notice``: the
    message's id) or an escalation raised (its id)."""

    TYPE: ClassVar[str] = "town_agent.told"
    notice: str


TOWN_AGENT_EVENTS: tuple[type[TownAgentEvent], ...] = (
    TownAgentStarted,
    TownAgentStopped,
    TownAgentLaunched,
    TownAgentAsked,
    TownAgentAskDelivered,
    TownAgentAnswered,
    TownAgentTold,
)
