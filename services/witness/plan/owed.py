"""Every action owed now: the parts of the plan put together, most urgent first."""

from __future__ import annotations

from services.witness.plan.actions import Action
from services.witness.plan.crew import owed as crew_owed
from services.witness.plan.endings import ended_sessions, mass_deaths, orphans
from services.witness.plan.nudges import context_pressure, continuations, queued_nudges, unannounced_mail
from services.witness.plan.observed import Observed
from services.witness.plan.policy import Policy
from services.witness.plan.scope import in_scope
from services.witness.plan.sessions import active_sessions
from services.witness.plan.spawns import beads_to_spawn
from services.witness.plan.town_agents import owed as town_agents_owed
from services.witness.state import WitnessState


def plan(state: WitnessState, obs: Observed, policy: Policy) -> list[Action]:
    """Every action owed now for the witness's rigs, most urgent first, leaving out those whose key is busy."""
    out: list[Action] = []
    out.extend(active_sessions(state, obs, policy))
    out.extend(beads_to_spawn(state, obs, policy))
    out.extend(ended_sessions(state, obs, policy))
    out.extend(mass_deaths(state, obs, policy))
    out.extend(orphans(state, obs, policy))
    out.extend(queued_nudges(state, obs))
    out.extend(continuations(state, obs))
    out.extend(context_pressure(state, policy.context_handoff_at))
    out.extend(unannounced_mail(state, obs))
    out.extend(crew_owed(state))
    if policy.rigs is None and obs.panes is not None:  # a witness of every rig supervises the town agents
        out.extend(town_agents_owed(state, obs.town_agents, obs.now))
    seen: set[str] = set(obs.busy)
    owed: list[Action] = []
    for action in out:
        if action.key not in seen:
            seen.add(action.key)
            owed.append(action)
    owed.sort(key=lambda a: a.PRIORITY)
    return in_scope(state, owed, policy.rigs)
