"""What the witness owes the town agents (docs/mayor-agent.md): a session of each wanted agent, launched again
when it died (backing off when it keeps dying), ended when the agent was stopped; its requests typed in when it is
at its prompt, one at a time; the answer recorded when the turn a request began ended; between requests, what it is
to be told (mail to it, escalations). Pure."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

from services.witness.plan.actions import (
    Action,
    DeliverAsk,
    EndTownAgent,
    LaunchTownAgent,
    RecordAnswer,
    TellTownAgent,
)
from services.witness.plan.observed import TownAgentSeen
from services.witness.state import TOWN_AGENT_LAUNCHES_KEPT, TownAgent, TownAgentAsk, WitnessState

RESUBMIT_AFTER = timedelta(seconds=20)
"""A request typed in whose runtime has not taken it this long after (it sits in its input box: the key that sends
it did not take), while the agent waits at its prompt, is sent again."""
RESTART_WINDOW = timedelta(minutes=10)
"""A town agent launched ``TOWN_AGENT_LAUNCHES_KEPT`` times within this window is launched again only once the
oldest of those launches is this old: an agent that dies at once (a bad key, a broken binary) is not restarted in a
loop."""


def owed(state: WitnessState, seen: dict[str, TownAgentSeen], now: datetime) -> Iterator[Action]:
    for agent in state.town_agents.values():
        looked = seen.get(agent.name, TownAgentSeen())
        if not agent.wanted:
            if looked.pane:
                yield EndTownAgent(name=agent.name)
            continue
        if not looked.alive:
            if launch_due(agent, now):
                yield LaunchTownAgent(name=agent.name, run=agent.run + 1)
            continue
        delivered = delivered_ask(agent)
        if delivered is not None:
            if looked.answer is not None:
                yield RecordAnswer(name=agent.name, ask=delivered.id, text=looked.answer)
            elif not looked.received and looked.idle and now - (delivered.delivered_at or now) >= RESUBMIT_AFTER:
                yield DeliverAsk(name=agent.name, ask=delivered.id, run=agent.run, again=True)
            continue  # one request at a time: the next waits for this one's answer
        waiting = next((ask for ask in agent.asks if ask.delivered_run < agent.run), None)
        if waiting is not None and looked.idle:
            yield DeliverAsk(name=agent.name, ask=waiting.id, run=agent.run)
        elif waiting is None and agent.notices and looked.idle:
            # Told only between requests: a request's turn is never interrupted, nor its answer mixed with a notice.
            yield TellTownAgent(name=agent.name, notice=agent.notices[0].id, run=agent.run)


def delivered_ask(agent: TownAgent) -> TownAgentAsk | None:
    """The request typed into the agent's current run and not answered yet (at most one is)."""
    return next((ask for ask in agent.asks if ask.delivered_run == agent.run and agent.run > 0), None)


def launch_due(agent: TownAgent, now: datetime) -> bool:
    """May the agent be launched (again) now: fewer than ``TOWN_AGENT_LAUNCHES_KEPT`` launches within
    ``RESTART_WINDOW``."""
    recent = agent.launches[-TOWN_AGENT_LAUNCHES_KEPT:]
    return len(recent) < TOWN_AGENT_LAUNCHES_KEPT or now - recent[0] >= RESTART_WINDOW
