"""Carries out the witness's actions: one ``match`` sends each to the job that does it (``spawn``, ``stop``,
``done``, ``cleanup``, ``nudge``, ``town_agent``); what the jobs share (the witness as ``Host``, tmux, locks, paths)
is the ``Toolkit``. Each step is recorded as an event (``toolkit``, "Failure windows")."""

from __future__ import annotations

from pathlib import Path

import structlog

from services.witness import plan as planning
from services.witness.effects.agent_env import AgentLaunch
from services.witness.effects.cleanup import Cleaner
from services.witness.effects.crew import CrewWorkspaces
from services.witness.effects.done import DoneFinisher
from services.witness.effects.nudge import Nudger
from services.witness.effects.spawn import Spawner
from services.witness.effects.stop import Stopper
from services.witness.effects.toolkit import Host, Toolkit
from services.witness.effects.town_agent import TownAgents
from services.witness.plan.actions import (
    Action,
    ClaimBead,
    Clean,
    ContinueSession,
    DeliverAsk,
    DeliverNudge,
    EndTownAgent,
    Escalate,
    ExpireNudge,
    GiveUp,
    Kill,
    KillOrphan,
    LaunchTownAgent,
    MakeCrewWorkspace,
    MassDeath,
    NudgeMail,
    ReapPane,
    RecordAnswer,
    ReleaseHook,
    RemoveCrewWorkspace,
    Resling,
    Spawn,
    Start,
    TellTownAgent,
    WarnContext,
    Warrant,
)
from services.witness.settings import WitnessSettings
from services.witness.state import Session
from shared.host.tmux import Tmux


class Executor:
    def __init__(self, host: Host, tmux: Tmux, settings: WitnessSettings, policy: planning.Policy) -> None:
        self.kit = Toolkit(host, tmux, settings, policy)
        self.launch = AgentLaunch(self.kit)
        self.spawner = Spawner(self.kit, self.launch)
        self.done = DoneFinisher(self.kit)
        self.stopper = Stopper(self.kit, self.done)
        self.cleaner = Cleaner(self.kit)
        self.nudger = Nudger(self.kit)
        self.town_agents = TownAgents(self.kit)
        self.crew = CrewWorkspaces(self.kit)

    @property
    def start_failures(self) -> dict[str, int]:
        """Session -> its starts that failed in a row (the plan gives up after ``max_start_failures``)."""
        return self.spawner.start_failures

    def session_dir(self, session: Session) -> Path:
        return self.kit.session_dir(session)

    async def run(self, action: Action) -> None:
        with structlog.contextvars.bound_contextvars(action=type(action).__name__, key=action.key):
            match action:
                case Spawn():
                    await self.spawner.spawn(action)
                case Start():
                    await self.spawner.start(action)
                case GiveUp():
                    await self.spawner.give_up(action)
                case Resling():
                    await self.spawner.resling(action)
                case ReleaseHook():
                    await self.spawner.release_hook(action)
                case ClaimBead():
                    await self.spawner.claim(action)
                case Warrant():
                    await self.stopper.warrant(action)
                case Kill():
                    await self.stopper.kill(action)
                case Escalate():
                    await self.stopper.escalate(action)
                case MassDeath():
                    await self.stopper.mass_death(action)
                case KillOrphan():
                    await self.stopper.kill_orphan(action)
                case Clean():
                    await self.cleaner.clean(action)
                case ReapPane():
                    await self.cleaner.reap_pane(action)
                case DeliverNudge():
                    await self.nudger.deliver_nudge(action)
                case ContinueSession():
                    await self.nudger.continue_session(action)
                case WarnContext():
                    await self.nudger.warn_context(action)
                case NudgeMail():
                    await self.nudger.nudge_mail(action)
                case ExpireNudge():
                    await self.nudger.expire_nudge(action)
                case MakeCrewWorkspace():
                    await self.crew.make(action)
                case RemoveCrewWorkspace():
                    await self.crew.remove(action)
                case LaunchTownAgent():
                    await self.town_agents.launch(action)
                case EndTownAgent():
                    await self.town_agents.end(action)
                case DeliverAsk():
                    await self.town_agents.deliver(action)
                case RecordAnswer():
                    await self.town_agents.record_answer(action)
                case TellTownAgent():
                    await self.town_agents.tell(action)
                case _:
                    raise TypeError(f"the witness has no handler for {type(action).__name__}")
