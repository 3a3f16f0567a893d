"""What the mayor knows: beads, molecules, convoys and escalations. Plain data, folded from the log."""

from __future__ import annotations

import msgspec

from shared.model.beads import Bead as Bead
from shared.model.beads import Hold as Hold
from shared.model.convoys import Convoy as Convoy
from shared.model.escalations import Escalation as Escalation
from shared.model.events.beads import BEAD_RANK, BEAD_STATUSES, INFRA_TYPES
from shared.model.events.molecules import STEP_STATUSES
from shared.model.molecules import Molecule as Molecule
from shared.model.molecules import Step as Step
from shared.model.usage import ModelUsage

STATUSES = BEAD_STATUSES
STATUS_RANK = BEAD_RANK
STEP_RANK = {status: rank for rank, status in enumerate(STEP_STATUSES)}
WISP_TYPE = "wisp"
"""Ephemeral beads: once closed long enough, garbage collection drops them entirely."""
MESSAGE_TYPE = "message"
READ_LABEL = "read"


class SessionCost(msgspec.Struct, kw_only=True):
    rig: str
    bead: str
    models: tuple[ModelUsage, ...] = ()
    final: bool = False


class UsageBook(msgspec.Struct, kw_only=True):
    sessions: dict[str, SessionCost] = {}
    days: dict[str, dict[str, ModelUsage]] = {}
    """``YYYY-MM-DD`` (UTC) -> model -> what was used that day."""


class MergeRef(msgspec.Struct, kw_only=True, gc=False):
    """A merge request of a bead not closed (the refinery's ``mr.submitted``): whose it is, and its branches."""

    bead: str
    branch: str = ""
    target: str = ""


class SendBack(msgspec.Struct, kw_only=True, gc=False):
    """The merge queue sent a bead's work back (``mr.conflicted`` sent back, or ``mr.failed`` not escalated) and
    the bead has not submitted again: the mayor owes its molecule a round of rework steps until it appended them
    (``molecule.rework_added`` naming ``event``)."""

    mr: str
    event: str
    """The send-back event's id: what the rework names (``sent_back_by``), so it is appended once."""
    reason: str
    """``conflict``, or the gate that failed."""
    exit_code: int = 0
    tail: str = ""
    files: list[str] = []
    target_commit: str = ""
    branch: str = ""
    target: str = ""


class KnownRig(msgspec.Struct, kw_only=True, gc=False):
    """A rig as the mayor needs it (the witness's ``rig.*`` and session events): whether it exists and takes work
    (sling), and which polecats it has had and the session each holds now (mail addresses)."""

    name: str
    parked: bool = False
    """Slings to it are accepted and wait: the witness starts no session there."""
    removed: bool = False
    """Slings to it are refused."""
    polecats: dict[str, str | None] = {}
    """Polecat name -> the session it holds now (None: none now)."""


class MayorState(msgspec.Struct, kw_only=True):
    beads: dict[str, Bead] = {}
    """Every bead, in creation order."""
    children: dict[str, list[str]] = {}
    """Parent id -> child ids, in creation order."""
    molecules: dict[str, Molecule] = {}
    """Bead id -> its molecule."""
    convoys: dict[str, Convoy] = {}
    open_convoys: list[str] = []
    """Ids of the convoys still open, so the plan looks at those only."""
    escalations: dict[str, Escalation] = {}
    holds: dict[str, Hold] = {}
    """Bead id -> its held sling, for open beads only (a sling or a close ends it), so the plan looks at those."""
    rigs: dict[str, KnownRig] = {}
    """Every rig added, by name (removed ones too: their names stay taken), with its polecats: what a sling may
    name, and what ``polecat:<rig>/<name>`` and ``rig:<rig>`` may address."""
    merge_requests: dict[str, MergeRef] = {}
    """Merge request id -> its bead and branches, for beads not closed (a bead's close drops its entries)."""
    send_backs: dict[str, SendBack] = {}
    """Bead id -> the send-back whose rework steps its molecule is owed (``plan.rework_owed``)."""
    usage: UsageBook = msgspec.field(default_factory=UsageBook)
    """Token usage of polecat sessions (``session.usage``), for ``gt costs``."""
    services: dict[str, str] = {}
    """Service scope -> up, down or stopped (the deacon's ``service.*``): an escalation about a service that is
    down is resolved once it is up."""
    commands_accepted: int = 0
    commands_rejected: int = 0


# ---- pure reads of the state, shared by decide, plan and queries ---------------------------------------


def open_blockers(state: MayorState, bead: Bead) -> list[str]:
    """The beads ``bead`` needs that are not closed, however they closed (a blocker that does not exist
    blocks). The one rule for both `gt ready` and dispatch: a bead is worked only once this is empty."""
    return [need for need in bead.needs if (blocker := state.beads.get(need)) is None or blocker.status != "closed"]


def is_ready(state: MayorState, bead: Bead) -> bool:
    """Open, real work, and every blocker closed."""
    return bead.status == "open" and bead.type not in INFRA_TYPES and not open_blockers(state, bead)


def depends_on(state: MayorState, start: str, target: str) -> bool:
    """True when ``start`` transitively needs ``target``."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        current = stack.pop()
        if current == target:
            return True
        if current in seen:
            continue
        seen.add(current)
        bead = state.beads.get(current)
        if bead is not None:
            stack.extend(bead.needs)
    return False


def is_ancestor(state: MayorState, candidate: str, bead_id: str) -> bool:
    """True when ``candidate`` is ``bead_id`` or one of its parents, grandparents, ..."""
    seen: set[str] = set()
    current: str | None = bead_id
    while current is not None and current not in seen:
        if current == candidate:
            return True
        seen.add(current)
        bead = state.beads.get(current)
        current = bead.parent if bead is not None else None
    return False


def dependents(state: MayorState, bead_id: str) -> list[str]:
    """Beads that need ``bead_id``, in creation order."""
    return [b.id for b in state.beads.values() if bead_id in b.needs]


def current_step(molecule: Molecule) -> Step | None:
    """The first step not done whose needs are all done (None when every step is done)."""
    done = {s.id for s in molecule.steps if s.status == "done"}
    for step in molecule.steps:
        if step.status != "done" and all(need in done for need in step.needs):
            return step
    return None


def unmet_needs(molecule: Molecule, step: Step) -> list[str]:
    done = {s.id for s in molecule.steps if s.status == "done"}
    return [need for need in step.needs if need not in done]


def is_complete(molecule: Molecule) -> bool:
    return all(step.status == "done" for step in molecule.steps)


def convoy_progress(state: MayorState, convoy: Convoy) -> tuple[int, int]:
    """(closed, total) beads; a bead that no longer exists counts as open."""
    closed = sum(1 for b in convoy.beads if (bead := state.beads.get(b)) is not None and bead.status == "closed")
    return closed, len(convoy.beads)


def convoy_waves(state: MayorState, convoy: Convoy) -> dict[str, int]:
    """Bead id -> its wave in the convoy: 1 for a bead that needs no bead the convoy tracks, else one more than
    the latest wave among those it needs. A blocker outside the convoy holds a bead back but makes no wave."""
    tracked = set(convoy.beads)
    waves: dict[str, int] = {}
    visiting: set[str] = set()  # on the way down: guards against a cycle (refused by update, never trusted)
    for start in convoy.beads:
        stack = [start]
        while stack:  # depth-first without recursion: a chain may be as long as the convoy
            current = stack[-1]
            if current in waves:
                stack.pop()
                continue
            visiting.add(current)
            bead = state.beads.get(current)
            needs = [need for need in bead.needs if need in tracked] if bead is not None else []
            pending = [need for need in needs if need not in waves and need not in visiting]
            if pending:
                stack.extend(pending)
                continue
            waves[current] = 1 + max((waves.get(need, 0) for need in needs), default=0)
            visiting.discard(current)
            stack.pop()
    return waves


def is_message(bead: Bead) -> bool:
    return bead.type == MESSAGE_TYPE


def is_read(bead: Bead) -> bool:
    return READ_LABEL in bead.labels
