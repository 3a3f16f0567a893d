"""What the refinery knows: merge requests, and the beads and rigs they refer to. Plain data."""

from __future__ import annotations

from datetime import datetime

import msgspec

from shared.model.events.beads import BeadStatus
from shared.model.gate_jobs import GateJob
from shared.model.gates import MoleculeGates
from shared.model.leases import Lease
from shared.model.merge_requests import MergeRequest as MergeRequest
from shared.model.rigs import Rig


class WorkBead(msgspec.Struct, kw_only=True, gc=False):
    id: str
    title: str
    status: BeadStatus = "open"
    rig: str | None = None
    priority: int = 2
    convoy_since: datetime | None = None
    """When the oldest convoy tracking it was created: its age raises the bead's merge requests in the queue."""
    conflicts_sent_back: int = 0
    """Merge conflicts of its merge requests sent back to its agent (``mr.conflicted`` with ``sent_back``)."""


class SessionRef(msgspec.Struct, kw_only=True, gc=False):
    """A polecat session as the witness requested it: the bead it works and the branch it pushes."""

    bead: str
    branch: str


class MergeQueue(msgspec.Struct, kw_only=True, gc=False):
    """A rig's merge queue as a whole (``gt.evt.mq.<rig>``): paused or not, and why."""

    rig: str
    paused: bool = False
    cause: str = ""
    """Why it is paused (``shared.model.events.merge_queues.PAUSE_CAUSES``); kept after a resume for the record."""
    reason: str = ""
    mr_id: str = ""
    """The merge request that met the cause."""
    detail: str = ""
    paused_at: datetime | None = None
    pauses: int = 0
    """Times it was paused: names each pause's escalation."""
    target_failures: int = 0
    """Gates failed on the target's tip in a row (since the last merge or resume)."""
    version: int = 0


class MergeMinute(msgspec.Struct, kw_only=True, gc=False):
    """The merges of one rig recorded in one minute of the log's time: what merges per hour and gate minutes per
    merge are counted from (``queries.board``)."""

    rig: str
    minute: datetime
    """The minute (its start) the ``mr.merged`` events were stored in."""
    merged: int = 0
    """Merge requests merged (``mr.merged``; one the target held already counts too)."""
    batches: int = 0
    """Batches that merged, counted at the first of their ``mr.merged`` events."""
    gate_seconds: float = 0.0
    """The gate time of those batches (``MergeRequestMerged.gate_seconds``: every gate the batch ran, the
    culprits' and the target's checks included), once per batch: every merge request of a batch carries it."""


class RunnerTally(msgspec.Struct, kw_only=True, gc=False):
    """A gate runner's finished jobs as the log records them (``gate.finished`` written by it)."""

    jobs_run: int = 0
    jobs_passed: int = 0
    gate_seconds: float = 0.0
    """The time of the gates it ran in those jobs."""
    last_finished_at: datetime | None = None


class RefineryState(msgspec.Struct, kw_only=True):
    mrs: dict[str, MergeRequest] = {}
    beads: dict[str, WorkBead] = {}
    """Work beads (not messages, convoys, escalations)."""
    rigs: dict[str, Rig] = {}
    """Rigs by name (``shared.model.rigs``): new gates apply to the next merge request taken, one under way keeps
    what it started with."""
    created: dict[str, str] = {}
    """Conflict bead create command id -> the bead it created."""
    awaited: dict[str, str] = {}
    """Command id (a conflict bead's create) -> the merge request waiting for its outcome."""
    convoys: dict[str, datetime] = {}
    """Convoy id -> when it was created."""
    merge_leases: dict[str, Lease] = {}
    """Rig merge leases (``merge-<rig>``) by lease name: the refinery that holds one is the only one that may
    push to the rig's targets; it renews it while it works and releases it after each batch."""
    hooks: dict[str, Lease] = {}
    """Hook leases (``hook-<bead>``) of beads not closed, by lease name: only a hook's holder, with its token,
    may submit the bead's work."""
    sessions: dict[str, SessionRef] = {}
    """Sessions of beads not closed, by id."""
    gates: dict[str, MoleculeGates] = {}
    """Molecules with a gate not opened, of beads not closed (``shared.model.gates.fold_book``): a session's work of
    such a bead is not taken (``gate_closed``)."""
    queues: dict[str, MergeQueue] = {}
    """Rigs' merge queues that were ever paused or met a failing target, by rig."""
    gate_jobs: dict[str, GateJob] = {}
    """Gate jobs on the runners (``GT_MQ_RUNNERS``) by id: the open ones and the newest finished."""
    merges: list[MergeMinute] = []
    """Merges by rig and minute, oldest first, over the last ``projection.MERGE_HISTORY`` of the log's time (older
    minutes leave as newer merges are recorded)."""
    last_batch: dict[str, str] = {}
    """Rig -> the batch whose gate time ``merges`` counted last (``projection.batch_key``): the other merge requests
    of that batch carry the same time and add only themselves."""
    runners: dict[str, RunnerTally] = {}
    """Gate runners (their scopes, ``runner-<name>``) by the jobs they finished; the ``projection.KEEP_RUNNERS``
    that finished one last."""
