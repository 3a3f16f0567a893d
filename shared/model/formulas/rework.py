"""Rework steps: what the mayor appends to a bead's molecule when the merge queue sends its work back. Pure.

A send-back (a merge conflict sent back to the agent, or a gate that failed on the rebased branch) never
reopens a done step: it adds a round of steps after the molecule's last one, named ``rework-<round>-<what>``,
each needing the one before, so the molecule's current step is the first of them and every reader of the
molecule (the beacon, ``gt prime``, the Stop hook, ``gt mol status``) points at it. One list of names, used by
the mayor (which appends them), the CLI (which leads ``gt prime`` with the send-back while one is current) and
the reference agent (which knows where to rebase).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from shared.model.events.molecules import StepSpec

PREFIX = "rework-"
CONFLICT = "conflict"
"""The ``reason`` of a round for a merge conflict; any other reason is the gate that failed."""
REBASE = "rebase"
"""A conflict's first step: rebase onto the target commit and resolve."""
FIX = "fix"
"""A failed gate's first step: fix what failed."""
RUN_TESTS = "run-tests"
SUBMIT = "submit"
STEP_ID = re.compile(r"^rework-(?P<round>[0-9]+)-(?P<what>[a-z-]+)$")
RESOLVE = (
    "Integrate your change with what landed: in each conflict keep what is on the target now as it is and "
    "working (its code, its tests, what it says), and re-apply your change on top of it, adapted to it. Where "
    "the two say different things about the same thing, what landed stands; your change keeps only what does "
    "not contradict it. Never keep both sides of a conflict side by side (two versions of one line or sentence "
    "give duplicate, broken or contradictory code and text), and leave no conflict markers. The rig's gates must "
    "pass on the result"
)
"""How to resolve a merge conflict sent back to an agent: one text for every runtime, in the rework step and in
``gt prime``. Not "keep both": two edits of one line kept together contradict each other."""
TAIL_SHOWN = 1200
"""Characters of a failed gate's output the fix step's description quotes (``gt prime`` shows more)."""


def is_rework(step_id: str) -> bool:
    return STEP_ID.match(step_id) is not None


def what(step_id: str) -> str | None:
    """What a rework step is for (``rebase``, ``fix``, ``run-tests``, ``submit``); None for any other step."""
    found = STEP_ID.match(step_id)
    return found["what"] if found is not None else None


def step_id(round_: int, what_: str) -> str:
    return f"{PREFIX}{round_}-{what_}"


def next_round(step_ids: Iterable[str]) -> int:
    """One more than the newest round among ``step_ids`` (1 for a molecule never reworked)."""
    rounds = [int(found["round"]) for s in step_ids if (found := STEP_ID.match(s)) is not None]
    return max(rounds, default=0) + 1


def rework_steps(
    round_: int,
    *,
    mr: str,
    reason: str,
    branch: str = "",
    target: str = "",
    target_commit: str = "",
    files: Iterable[str] = (),
    exit_code: int = 0,
    tail: str = "",
) -> list[StepSpec]:
    """The steps of rework round ``round_`` for merge request ``mr`` sent back for ``reason`` (``conflict``, or
    the gate that failed), each needing the one before. ``branch`` and ``target`` are the merge request's (its
    branch and the branch it merges into), named in the instructions when known."""
    branch_named = branch or "your branch"
    into = f" ({target})" if target else ""
    if reason == CONFLICT:
        commit = target_commit or "the target's newest commit"
        conflicting = ", ".join(files) or "files git did not name"
        first = StepSpec(
            id=step_id(round_, REBASE),
            title=f"Rebase onto {target_commit[:12] or 'the target'} and resolve the conflicts in {conflicting}",
            description=(
                f"Merge request {mr} conflicted with the target{into} at {commit} in {conflicting}. Rebase onto "
                f"that commit (`git fetch origin && git rebase {commit}`) and resolve each conflict. {RESOLVE}. "
                "`git add` the files and `git rebase --continue`. Then push the rebased branch: "
                f"`git push --force-with-lease origin {branch_named}` (the merge queue takes the branch as it is "
                "on the remote)."
            ),
            acceptance=(
                f"The branch is rebased onto {commit} and pushed: what landed is kept and still works, your change "
                "is integrated with it, no conflict is resolved by keeping both sides, no conflict markers are left."
            ),
        )
    else:
        output = " ".join(tail.split())[-TAIL_SHOWN:]
        first = StepSpec(
            id=step_id(round_, FIX),
            title=f"Fix what made the {reason} gate fail",
            description=(
                f"Merge request {mr} failed its {reason} gate (exit {exit_code}) on your branch rebased onto the "
                f"target{into}. Find the cause in your change, fix it and commit."
                + (f" The gate's last output: {output}" if output else "")
            ),
            acceptance=f"The {reason} gate's command passes in your worktree and the fix is committed.",
        )
    run_tests = StepSpec(
        id=step_id(round_, RUN_TESTS),
        title="Run the tests on the reworked branch",
        description="Run the rig's gates (`gt prime` lists them); fix and commit what fails.",
        needs=[first.id],
        acceptance="The tests pass.",
    )
    submit = StepSpec(
        id=step_id(round_, SUBMIT),
        title="Submit the reworked branch to the merge queue",
        description=(
            f"Mark this step done (`gt step done {step_id(round_, SUBMIT)}`) and run `gt done`: it pushes the "
            "branch and submits it to the merge queue again."
        ),
        needs=[run_tests.id],
        acceptance="`gt done` reported the merge request.",
    )
    return [first, run_tests, submit]
