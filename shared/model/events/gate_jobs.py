"""Events of a gate job (``gt.evt.gate.<job id>``): one candidate commit to run a rig's gates on, requested by
the refinery and run by a gate runner (``gt-runner``). The job is durable work: its request, its start, each
heartbeat and its result are in the log, so a runner that dies is replaced (another runner takes the job once
its heartbeats stop), and a refinery that restarts finds the jobs it asked for and waits for them.

Every runner event expects the job's last sequence: of two runners taking one job only one succeeds, and a
runner that lost its job (it went quiet and another took it) can write nothing more about it."""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from shared.model.events.base import Event

GateJobStatus = Literal["requested", "running", "finished", "cancelled"]
GATE_JOB_OPEN: tuple[GateJobStatus, ...] = ("requested", "running")
"""Still to be run, or running: what a runner may take (a running one only when its runner went quiet)."""


class GateResult(msgspec.Struct, frozen=True, kw_only=True):
    """One gate command's run: how it ended, how long it took, the end of its output and where all of it is
    (on the host that ran it)."""

    gate: str
    exit_code: int
    seconds: float
    tail: str
    log_path: str


class GateCommand(msgspec.Struct, frozen=True, kw_only=True):
    """One gate of a rig: its name (``setup``, ``lint``, ``test``) and the shell command it runs."""

    gate: str
    command: str


class GateJobEvent(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "gate"
    job_id: str

    def aggregate_id(self) -> str:
        return self.job_id


class GateJobRequested(GateJobEvent, frozen=True, kw_only=True):
    """Run ``gates`` on ``commit``, which the refinery pushed to ``ref`` in the rig's repository (``repo``) for any
    runner to fetch by that name. ``key`` names the candidate's stack (the rig, the target's tip it stands on and
    the merge requests stacked on it, each at its head): a refinery that restarts adopts a job by it instead of
    asking again."""

    TYPE: ClassVar[str] = "gate.requested"
    rig: str
    repo: str
    target: str
    base: str
    """The target's tip the candidate stands on."""
    commit: str
    ref: str
    stack: list[str] = []
    """The merge requests the candidate carries, in stack order (empty: the target's tip itself)."""
    key: str
    gates: list[GateCommand]
    env: list[str] = []
    """Names of the runner's environment variables the gates get (the rig's ``gate_env``)."""
    timeout_s: float
    pristine: bool = False
    requester: str
    """The refinery process that asked."""


class GateJobStarted(GateJobEvent, frozen=True, kw_only=True):
    """A runner took the job (``attempt`` counts takes: above 1 when a runner before went quiet)."""

    TYPE: ClassVar[str] = "gate.started"
    runner: str
    attempt: int


class GateJobHeartbeat(GateJobEvent, frozen=True, kw_only=True):
    """The runner still runs the job, now its gate ``gate``."""

    TYPE: ClassVar[str] = "gate.heartbeat"
    runner: str
    attempt: int
    gate: str = ""


class GateJobFinished(GateJobEvent, frozen=True, kw_only=True):
    """The gates ran: ``results`` in order, stopped at the first that failed (``passed`` when none did). Or they
    could not run (``error``: the candidate could not be fetched, the workspace not made): not the change's fault,
    the refinery tries again later."""

    TYPE: ClassVar[str] = "gate.finished"
    runner: str
    attempt: int
    passed: bool
    results: list[GateResult] = []
    error: str = ""


class GateJobCancelled(GateJobEvent, frozen=True, kw_only=True):
    """The refinery needs the job's answer no more (a candidate ahead of it failed, or its batch ended): a runner
    stops running it."""

    TYPE: ClassVar[str] = "gate.cancelled"
    reason: str


GATE_JOB_EVENTS: tuple[type[Event], ...] = (
    GateJobRequested, GateJobStarted, GateJobHeartbeat, GateJobFinished, GateJobCancelled
)  # fmt: skip
