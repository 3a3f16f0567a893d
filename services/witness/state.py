"""What the witness knows: rigs, sessions, the beads slung to its rigs, nudges. Plain data, folded from the log."""

from __future__ import annotations

from datetime import datetime

import msgspec

from shared.core import subjects
from shared.model.crew import Crew as Crew
from shared.model.events.beads import BeadStatus
from shared.model.events.molecules import StepGate
from shared.model.gates import MoleculeGates
from shared.model.leases import Lease
from shared.model.rigs import Rig as Rig
from shared.model.sessions import MergeFailure as MergeFailure
from shared.model.sessions import Nudge as Nudge
from shared.model.sessions import Session as Session
from shared.model.usage import ModelUsage


class WorkBead(msgspec.Struct, kw_only=True, gc=False):
    """The witness's view of a bead (the mayor's events): enough to spawn, brief and watch a session."""

    id: str
    title: str
    status: BeadStatus = "open"
    closed_at: datetime | None = None
    rig: str | None = None
    slings: int = 0
    slung_seq: int = 0
    """Stream sequence of the last sling: beads waiting for a polecat are served in this order."""
    sessions_at_sling: int = 0
    """How many of ``sessions`` came before the last sling: a sling asks for a session after them."""
    deaths_at_sling: int = 0
    """Deaths before the last operator sling: only later ones count against the respawn limit."""
    sessions_at_operator_sling: int = 0
    """How many of ``sessions`` came before the last operator sling (not the witness's re-sling of a respawn,
    which names its session): the respawn backoff counts quick deaths after it."""
    steps: list[str] = []
    """Step ids in molecule order."""
    done_steps: list[str] = []
    current_step: str | None = None
    last_progress_at: datetime | None = None
    """Last step event or sling: with heartbeats, what stall detection looks at."""
    merge_requested: bool = False
    returned: bool = False
    """The refinery sent its work back (gates failed, or a merge conflict) since its last session was requested."""
    merge_failure: MergeFailure | None = None
    """The last failure the refinery reported (mr, gate, exit_code, tail): shown by ``gt prime``."""
    rework_owed: bool = False
    """The work was sent back and the mayor has not appended its rework steps to the molecule yet: no session
    until it has, or the session would be told that every step is done."""
    sessions: list[str] = []
    """Every session the bead has had, oldest first."""
    merge_rejected: bool = False
    """Its last merge request was rejected by an operator: nobody works it until someone decides."""
    stale_recoveries: int = 0
    """Times its stale hook was re-slung by the witness (a second stale hook is escalated)."""
    resling_owed: bool = False
    """A stale-hook recovery decided to re-sling it and the sling is not in the log yet."""
    unslung: bool = False
    """An operator released its hook (``bead.unslung``) and it was not slung since: a session on it is ended."""
    unsling_remove_worktree: bool = False
    """The unsling asked for the worktree to go (it stays anyway when it holds unsaved work)."""
    agent: str | None = None
    """The agent runtime a sling chose for its sessions (``bead.slung``'s ``agent``); None: the rig's."""
    gates: MoleculeGates = msgspec.field(default_factory=MoleculeGates)
    """Its molecule's gates (``shared.model.gates``): while its current step's is closed it gets no session."""

    def waiting_gate(self) -> tuple[str, StepGate] | None:
        """The current step and its closed gate, while the bead waits on it."""
        return self.gates.waiting()


class MailNotice(msgspec.Struct, kw_only=True, gc=False):
    """An unread message to a polecat (the mayor's ``message`` beads): its live session is nudged once."""

    id: str
    rig: str
    polecat: str
    sender: str
    subject: str
    nudged: bool = False
    """The nudge telling of it is queued (``nudge.queued`` with the id ``mail_nudge_id(id)``)."""


class UsageMark(msgspec.Struct, kw_only=True, gc=False):
    version: int
    """The usage aggregate's last subject sequence (the expected sequence of the next ``session.usage``)."""
    models: tuple[ModelUsage, ...] = ()
    final: bool = False
    context_tokens: int = 0
    context_window: int = 0


TOWN_AGENT_LAUNCHES_KEPT = 5
MAX_NOTICES = 50
"""Notices kept for a town agent: a flood of mail or escalations is told up to this many (its prime lists them)."""
"""How many of a town agent's launch times are kept: its restarts back off over that many."""


class TownAgentAsk(msgspec.Struct, kw_only=True, gc=False):
    """A request for a town agent (``town_agent.asked``), until it is answered."""

    id: str
    text: str
    asked_at: datetime
    delivered_run: int = 0
    """The run it was typed into (0: not yet); a newer run gets it again (its conversation is new)."""
    delivered_at: datetime | None = None
    transcript: str = ""
    """The transcript its answer is read from, from ``offset`` (``town_agent.ask_delivered``)."""
    offset: int = 0


class TownAgentNotice(msgspec.Struct, kw_only=True, gc=False):
    """What a town agent is to be told when it waits at its prompt: mail to it, an escalation raised (their words
    are others', typed quoted on one line: ``effects/town_agent.py``)."""

    id: str
    """The message's or the escalation's id."""
    kind: str
    """``mail`` or ``escalation``."""
    sender: str
    """The mail's sender; the escalation's source."""
    subject: str
    """The mail's subject; the escalation's message."""
    severity: str = ""


class TownAgent(msgspec.Struct, kw_only=True, gc=False):
    """A town agent the witness supervises (docs/mayor-agent.md): the mayor agent."""

    name: str
    agent: str
    """The runtime it runs."""
    wanted: bool = True
    """Started and not stopped since: a dead session of it is started again."""
    version: int = 0
    """The aggregate's last subject sequence (the expected sequence of the next event of it)."""
    run: int = 0
    """Its sessions launched since it was first started (``town_agent.launched``)."""
    pane_pid: int | None = None
    pid_started: float = 0.0
    launched_at: datetime | None = None
    launches: list[datetime] = []
    """When its recent sessions were launched (the newest ``TOWN_AGENT_LAUNCHES_KEPT``): restarts back off."""
    asks: list[TownAgentAsk] = []
    """Requests not answered yet, oldest first."""
    notices: list[TownAgentNotice] = []
    """What it is to be told (mail to it, escalations) and was not yet, oldest first (at most ``MAX_NOTICES``)."""

    @property
    def tmux_name(self) -> str:
        return subjects.town_agent_tmux_name(self.name)

    @property
    def user(self) -> str:
        """Its NATS user, the label of its pane and the name of its directory: ``agent-<name>``."""
        return subjects.town_agent_user(self.name)


class WitnessState(msgspec.Struct, kw_only=True):
    rigs: dict[str, Rig] = {}
    """Its rigs, by name (``shared.model.rigs``)."""
    sessions: dict[str, Session] = {}
    beads: dict[str, WorkBead] = {}
    nudges: dict[str, Nudge] = {}
    mr_beads: dict[str, str] = {}
    """Merge request id -> its bead."""
    hand_mr_rigs: dict[str, str] = {}
    """Merge requests submitted by hand (no session: a crew member's), not merged yet -> their rig."""
    mass_deaths: dict[str, list[str]] = {}
    """Rig -> sessions already covered by a mass-death escalation."""
    mass_deaths_open: set[str] = set()
    """Rigs whose last mass death is not over: a death there joins it (covered; no second escalation) until a
    session of the rig ends ``done`` or the operator changes the rig (``rig.updated``, ``rig.unparked``)."""
    hooks: dict[str, Lease] = {}
    """Hook leases (``hook-<bead>``) by lease name: the witness acquires one for each session it starts and
    releases it once that session is cleaned; the agent renews it; the deacon expires it."""
    mail: dict[str, MailNotice] = {}
    """Unread, open messages to polecats, by message id."""
    usage: dict[str, UsageMark] = {}
    """Session id -> its usage as last recorded (``session.usage``), so a restarted witness records only change."""
    town_agents: dict[str, TownAgent] = {}
    """The town agents ever started, by name (``town_agent.*``)."""
    crews: dict[str, Crew] = {}
    """Crew members by ``crew_key`` (``crew.*``), removed ones too until their workspace is gone."""
    base_merged: dict[str, int] = {}
    """Rig -> stream sequence of the newest merge its merge queue pushed to its base (``mr.merged``): a rig's clone
    fetched before it lacks that work, and a new branch must not start from it (``effects/clone_fetch.py``)."""


MAIL_NUDGE_PREFIX = "mail-"


def crew_of_bead(state: WitnessState, bead: str) -> Crew | None:
    """The crew member (not removed) the bead is hooked to: its sessions run in that member's workspace."""
    for crew in state.crews.values():
        if crew.hooked == bead and crew.status == "added":
            return crew
    return None


def crew_workspaces(state: WitnessState) -> set[str]:
    """Every crew member's workspace not removed yet: no session's end removes it."""
    return {crew.workspace for crew in state.crews.values() if not crew.gone}


def agent_of(session: Session, rig: Rig | None) -> str:
    """What ``session`` runs: its own agent, recorded when it was requested, so that a rig changing runtime
    (``gt rig update --agent``) leaves its running sessions as they are; the rig's for a session from an older
    log."""
    return session.agent or (rig.agent_command if rig is not None else "")


def agent_for(bead: WorkBead, rig: Rig) -> str:
    """What a new session of ``bead`` is to run: the runtime its sling chose, else its rig's ``agent_command`` now.
    Recorded in ``session.requested`` (``agent_of`` reads it back): every session of a bead slung with a runtime
    runs that one (a respawn, a handoff, rework), whatever its rig runs."""
    return bead.agent or rig.agent_command


def mail_nudge_id(message_id: str) -> str:
    """The nudge that tells a polecat of a message: one per message, so queuing it twice stores it once."""
    return f"{MAIL_NUDGE_PREFIX}{message_id}"


def context_nudge_id(session_id: str, share: float) -> str:
    """The nudge that tells a session its context passed ``share`` of the window: one per share and session."""
    return f"context-{session_id}-{round(share * 100)}"


def continue_nudge_id(session_id: str, start: int) -> str:
    """The nudge that sends a session on after its agent's ``start``-th start (a ``/clear``, a compaction): one
    per start, so a restarted witness that sees the same start queues nothing new."""
    return f"continue-{session_id}-{start}"
