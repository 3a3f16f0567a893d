"""What processing a batch of merge requests came to: the merger's answer (``effects/merger.py``), which
``settle`` turns into events and commands. Plain data."""

from __future__ import annotations

import msgspec

from shared.model.events.gate_jobs import GateResult as GateResult


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """What became of one merge request of a batch."""

    kind: str
    """merged, already_merged, conflict, failed, push_refused, deferred, branch_missing, target_failed (a gate
    failed on the target's tip too: not this merge request's failure, it goes back into the queue)."""
    target_before: str = ""
    merged_commit: str = ""
    files: list[str] = []
    failure: GateResult | None = None
    reason: str = ""
    """Why a deferred one goes back into the queue."""
    refusal: str = ""
    """push_refused: why git refused the push (a class of ``refusals``); ``failure`` holds git's message."""


class TargetFailed(Exception):
    """A gate failed on a merge request and on the target's tip too: the batch stops, nobody is blamed."""

    def __init__(self, result: GateResult, command: str, commit: str) -> None:
        super().__init__(f"the {result.gate} gate fails on the target too")
        self.result, self.command, self.commit = result, command, commit


class BatchResult(msgspec.Struct, kw_only=True):
    outcomes: dict[str, Outcome] = {}
    """Merge request id -> its outcome; every merge request of the batch has one."""
    merged: list[str] = []
    """The merge requests that landed together with this push, in stack order."""
    gates_run: int = 0
    gate_seconds: float = 0.0
    rounds: int = 0
    """Times a stack was built and gated (more than one when a culprit was taken out)."""
    target_failed: TargetFailed | None = None
    """A gate that failed on the target's tip too: it blamed nobody, nothing was pushed."""
    flaky: dict[str, list[str]] = {}
    """Merge request id -> gates that failed on its candidate and passed when run once more (not blamed)."""
    fenced: str = ""
    """Why nothing was pushed: this refinery no longer holds the rig's merge lease (its outcomes are void)."""
