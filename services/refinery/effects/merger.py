"""Processing merge requests with git and the rig's gates. Blocking (run in a thread).

One code path serves serial and batch mode: a batch of one is the serial case. The merge requests are rebased
one on top of the other onto the target (a stack), the gates run once on the stack's tip, and when they fail
the stack is bisected: the first prefix that fails names the culprit, the prefix before it (tested green) is
kept, and the rest is stacked again on it and gated again, until what remains is green. One fast-forward push
then lands everything that passed.

The rig's refinery clone lives in ``GT_HOME/rigs/<rig>/refinery/repo.git`` (its own, so it never races the
witness's git). Merge requests are rebased in the clone itself, with no work tree (``git_replay``: the cost
follows the change), and pushed from there; the gates run in the rig's persistent gate workspace
(``shared.host.gates.workspace``: ``.../refinery/workspace``), or with a gate user in that user's
(``shared.host.gates.user``); with gate runners, as jobs on them (``gate_jobs``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

import structlog

from services.refinery.plan import refusals, speculation
from services.refinery.plan.outcomes import BatchResult, GateResult, Outcome, TargetFailed
from services.refinery.state import MergeRequest
from shared.core.faults import crash_point
from shared.host import git, git_replay, path_locks
from shared.host.gates import execution, runs
from shared.host.gates.user import GateWorkspaces
from shared.model import done_flow
from shared.model.commands import MergeRequestSubmit
from shared.model.crew import crew_of_branch
from shared.model.events.gate_jobs import GateCommand
from shared.model.gate_jobs import stack_key
from shared.model.rigs import Rig

log = structlog.get_logger(__name__)

GATES = ("setup", "lint", "test")


class Paths:
    def __init__(self, rigs_root: Path, rig: str) -> None:
        self.home = rig
        """The rig's directory name under the rigs root (``home_name``)."""
        self.root = rigs_root / rig / "refinery"
        self.bare = self.root / "repo.git"
        self.work = self.root / "work"
        """Temporary worktrees of earlier versions (one per merge): removed at start."""
        self.workspace = self.root / "workspace"
        """The rig's persistent gate workspace (``workspace``)."""
        self.logs = self.root / "logs"
        self.gates = self.root / "gates"
        """Records of the gates running now (``shared.host.gates.runs``): what a refinery starting stops first."""


def clean_worktrees(paths: Paths) -> list[str]:
    """Remove every temporary worktree an earlier version left; their names."""
    if not paths.work.exists():
        return []
    removed = []
    for child in sorted(paths.work.iterdir()):
        git.force_remove(child)
        removed.append(child.name)
    if paths.bare.exists():
        git.git("worktree", "prune", cwd=paths.bare)
    return removed


def remove_leftovers(rigs_root: Path) -> None:
    """What a crashed refinery left: its gates' processes (were their watchers killed too), and an earlier
    version's temporary worktrees. (The gate workspace is repaired where it is used: ``workspace.check_out``.)"""
    if not rigs_root.exists():
        return
    for rig_dir in sorted(rigs_root.iterdir()):
        paths = Paths(rigs_root, rig_dir.name)
        try:
            stopped = runs.stop_leftovers(paths.gates)
            if stopped:
                log.warning("leftover_gates_stopped", rig=rig_dir.name, pids=stopped)
            removed = clean_worktrees(paths)
        except (git.GitError, OSError) as exc:
            # A rig whose leftovers cannot go is logged; the next attempt at one of its merge requests replaces
            # its own worktree anyway.
            log.warning("temp_worktree_cleanup_failed", rig=rig_dir.name, error=str(exc))
            continue
        if removed:
            log.info("temp_worktrees_removed", rig=rig_dir.name, worktrees=removed)


class Candidate(NamedTuple):
    """A commit to gate: the tip of a stack of merge requests on the target (``stack``: their ids, in order; empty
    for the target's tip itself), with its adoption key (``shared.model.gate_jobs.stack_key``)."""

    commit: str
    key: str
    stack: tuple[str, ...]


class GateBackend(Protocol):
    """Who runs the gates: the refinery itself (``LocalGates``, one probe at a time) or the gate runners
    (``gate_jobs.RunnerGates``, ``width`` probes at once, each a durable job)."""

    @property
    def width(self) -> int:
        """Candidates gated at once."""
        ...

    @property
    def runs(self) -> int:
        """Gate commands run so far."""
        ...

    @property
    def seconds(self) -> float:
        """Their time, added up."""
        ...

    def first_red(
        self, candidates: Sequence[Candidate], gates: Sequence[GateCommand], *, fresh: bool = False
    ) -> tuple[int, GateResult] | None:
        """The first of ``candidates`` (in order) on which a gate fails, with that gate's result; None when every
        one passes. Candidates after the first red one may be left ungated. ``fresh``: gated again, never an
        answer given before."""
        ...

    def adopted(self, key: str) -> str | None:
        """The commit of a candidate gated (or being gated) before under ``key``, to stack on instead of replaying
        (a restarted refinery adopts its predecessor's jobs); None when there is none."""
        ...

    def close(self) -> None:
        """The batch is done: nothing it started runs on."""
        ...

    def known_green(self, commit: str, gate: GateCommand) -> bool:
        """Whether ``gate`` (that very command) is known to pass on ``commit`` already (the target's tip is the
        last candidate landed): its run on the target would tell nothing new."""
        ...


class Landed(NamedTuple):
    """The last candidate this refinery landed on a rig, and the gates it passed to land."""

    commit: str
    gates: tuple[GateCommand, ...]


def landed_of(result: BatchResult, rig: Rig, before: Landed | None) -> Landed | None:
    """What ``result`` landed (its tip passed every gate of the rig to land), else what had landed ``before``."""
    if not result.merged:
        return before
    return Landed(commit=result.outcomes[result.merged[-1]].merged_commit, gates=tuple(gate_commands(rig)))


class LocalGates:
    """The refinery's own gates: one probe at a time, in the rig's persistent gate workspace (``execution.Prober``)."""

    def __init__(
        self,
        paths: Paths,
        rig: Rig,
        name: str,
        timeout: float,
        gate_workspaces: GateWorkspaces | None,
        landed: Landed | None = None,
    ):
        place = execution.Place(
            clone=paths.bare, workspace=paths.workspace, logs=paths.logs, records=paths.gates, home=paths.home
        )
        env = execution.gate_environment(rig.gate_env, os.environ)
        self.prober = execution.Prober(
            place, env, timeout, gate_workspaces=gate_workspaces, pristine=rig.gate_pristine, hold_settle=True,
            on_first_gate=lambda: crash_point("refinery.during_gates"),
        )  # fmt: skip
        self.name = name
        self.landed = landed

    @property
    def width(self) -> int:
        return 1

    @property
    def runs(self) -> int:
        return self.prober.runs

    @property
    def seconds(self) -> float:
        return self.prober.seconds

    def first_red(
        self, candidates: Sequence[Candidate], gates: Sequence[GateCommand], *, fresh: bool = False
    ) -> tuple[int, GateResult] | None:
        for index, candidate in enumerate(candidates):
            prefix = f"{self.name}-on-target" if not candidate.stack else f"{self.name}-p{self.runs}"
            results = self.prober.probe(candidate.commit, gates, prefix)
            failed = [r for r in results if r.exit_code != 0]
            if failed:
                return index, failed[0]
        return None

    def adopted(self, key: str) -> str | None:
        return None

    def close(self) -> None:
        """Nothing outlives a probe here but the workspace's settle, held back until the batch was pushed (it
        would share the machine with the push): it starts now."""
        self.prober.release_settle()

    def known_green(self, commit: str, gate: GateCommand) -> bool:
        return self.landed is not None and self.landed.commit == commit and gate in self.landed.gates


def gate_commands(rig: Rig) -> list[GateCommand]:
    """The rig's gates, in the order they run."""
    commands = (rig.setup_command, rig.lint_command, rig.test_command)
    return [GateCommand(gate=g, command=c) for g, c in zip(GATES, commands, strict=True) if c]


class Gates:
    """The rig's gates on candidates, through a backend. A gate that fails is run once on the target too: if the
    target fails it as well, it blames nobody and the batch stops (``TargetFailed``): nothing merges with a gate
    skipped."""

    def __init__(self, backend: GateBackend, rig: Rig, branch: str, target: str, *, retry_red: bool = False) -> None:
        self.backend, self.rig, self.branch, self.target = backend, rig, branch, target
        self.commands = gate_commands(rig)
        self.passes_on_target: set[str] = set()
        self.retry_red = retry_red
        self.flaky: dict[str, list[str]] = {}
        """Merge request id -> gates that failed on its candidate and passed when run once more."""
        self._retried: set[str] = set()

    def key(self, base: str, stack: Sequence[tuple[str, str]]) -> str:
        """The adoption key of ``stack`` ((merge request, head) pairs) on ``base``."""
        return stack_key(self.rig.name, self.branch, base, list(stack), self.commands)

    def first_red(self, candidates: Sequence[Candidate]) -> tuple[int, GateResult] | None:
        """The first candidate that fails a gate (and the target does not), or None.

        Raises:
            TargetFailed: the gate that failed fails on the target's tip too.
        """
        found = self.backend.first_red(candidates, self.commands)
        if found is not None and self.retry_red and candidates[found[0]].key not in self._retried:
            index, red = found
            candidate = candidates[index]
            self._retried.add(candidate.key)
            if self.backend.first_red([candidate], self.commands, fresh=True) is None:
                # Green when run again: flaky. Its merge request is not blamed; the rest are looked at from there.
                self.flaky.setdefault(candidate.stack[-1], []).append(red.gate)
                log.warning("gate_flaky", mr=candidate.stack[-1], gate=red.gate, commit=candidate.commit)
                rest = self.first_red(candidates[index + 1 :])
                return (index + 1 + rest[0], rest[1]) if rest is not None else None
        if found is None:
            return None
        failure = found[1]
        gate = next(g for g in self.commands if g.gate == failure.gate)
        if failure.gate not in self.passes_on_target and not self.backend.known_green(self.target, gate):
            on_target = Candidate(commit=self.target, key=self.key(self.target, []), stack=())
            target_red = self.backend.first_red([on_target], [gate])
            if target_red is not None:
                raise TargetFailed(target_red[1], gate.command, self.target)
            self.passes_on_target.add(failure.gate)
        return found


def _clone_lock(paths: Paths) -> threading.Lock:
    """One writer at a time of the clone's remote refs and of the clone itself (a batch's fetch, a bundle's
    import, the first clone of a rig): two would race for git's ref locks, or for the clone's place."""
    return path_locks.lock(paths.bare)


def import_published(paths: Paths, rig: Rig, mr: MergeRequestSubmit, max_bytes: int) -> git.BundleProblem | None:
    """A session's published bundle (``mr.bundle``) imported into the rig's clone, its head pinned (see
    ``git.import_bundle``); None when it is there now, else why it was refused."""
    assert mr.bundle is not None
    with _clone_lock(paths):
        git.ensure_bare_clone(rig.repo, paths.bare)
        session = done_flow.publisher(mr.session, mr.branch)
        if _rev(paths, git.imported_ref(session, mr.head)):
            return None  # imported before for this session (the command delivered again)
        return git.import_bundle(
            paths.bare,
            Path(mr.bundle),
            mr.branch,
            mr.head,
            target=session,
            max_bytes=max_bytes,
            scratch=paths.root / "bundles",
        )


def process(
    paths: Paths,
    rig: Rig,
    mrs: Sequence[MergeRequest],
    *,
    name: str,
    gate_timeout: float,
    lost_lease: Callable[[], str | None] = lambda: None,
    gate_workspaces: GateWorkspaces | None = None,
    backend: Callable[[str], GateBackend] | None = None,
    retry_red: bool = False,
    landed: Landed | None = None,
) -> BatchResult:
    """Land what can be landed of ``mrs`` (in this order) on their target with one fast-forward push.

    ``lost_lease`` is asked right before the push: a refinery that lost the rig's merge lease pushes nothing.
    ``backend``: who runs the gates, made for the target's tip (None: the refinery itself, ``LocalGates``, and
    ``gate_workspaces`` the gate user's workspaces when gates run as another OS user, None for its own);
    ``retry_red``: a red candidate is gated once more before it is blamed (``Gates``); ``landed``: the last
    candidate this refinery landed on the rig (a gate that passed on it is not run on it again).
    """
    target = mrs[0].target
    with _clone_lock(paths):
        git.ensure_bare_clone(rig.repo, paths.bare)
        git.fetch(paths.bare)
    result = BatchResult()
    target_before = _rev(paths, f"refs/remotes/origin/{target}")
    if not target_before:
        for mr in mrs:
            failure = _note("branch", f"the target branch {target} does not exist")
            result.outcomes[mr.id] = Outcome(kind="branch_missing", failure=failure)
        return result
    made = (
        backend(target_before)
        if backend is not None
        else LocalGates(paths, rig, name, gate_timeout, gate_workspaces, landed)
    )
    try:
        gates = Gates(made, rig, target, target_before, retry_red=retry_red)
        return _gate_and_push(paths, rig, mrs, gates, result, lost_lease)
    finally:
        made.close()


def _gate_and_push(
    paths: Paths,
    rig: Rig,
    mrs: Sequence[MergeRequest],
    gates: Gates,
    result: BatchResult,
    lost_lease: Callable[[], str | None],
) -> BatchResult:
    target, target_before = mrs[0].target, gates.target
    try:
        good = _land_in_rounds(paths, mrs, target_before, gates, result)
    except TargetFailed as exc:
        # Not theirs: every merge request not settled yet goes back into the queue, nothing is pushed.
        result.target_failed = exc
        for mr in mrs:
            if mr.id not in result.outcomes:
                result.outcomes[mr.id] = Outcome(kind="target_failed", target_before=target_before, failure=exc.result)
        good = []
    result.gates_run, result.gate_seconds = gates.backend.runs, gates.backend.seconds
    result.flaky = gates.flaky
    if not good:
        return result
    tip = good[-1][1]
    result.fenced = lost_lease() or ""
    if result.fenced:
        return result
    # A plain push only fast-forwards: if the target moved meanwhile it is refused and nothing is lost. Into a
    # local checkout it updates the checked-out branch's work tree when clean (see git.checkout_receive_pack).
    pushed = git.push_commit(paths.bare, tip, target, receive_pack=git.checkout_receive_pack(rig.repo))
    if pushed.exit_code != 0:
        refusal = refusals.classify(pushed.exit_code, pushed.stderr)
        said = refusals.message(pushed.stderr) or f"git push exited {pushed.exit_code} and said nothing"
        failure = _note("push", said, pushed.exit_code)
        log.info("push_refused", target=target, refusal=refusal, exit_code=pushed.exit_code)
        for mr, _ in good:
            result.outcomes[mr.id] = Outcome(
                kind="push_refused", target_before=target_before, refusal=refusal, failure=failure
            )
        return result
    crash_point("refinery.after_push")
    for mr, _ in good:
        result.outcomes[mr.id] = Outcome(kind="merged", target_before=target_before, merged_commit=tip)
    result.merged = [mr.id for mr, _ in good]
    return result


def _land_in_rounds(
    paths: Paths,
    mrs: Sequence[MergeRequest],
    target_before: str,
    gates: Gates,
    result: BatchResult,
) -> list[tuple[MergeRequest, str]]:
    """Stack, gate, take the culprit out on red; the merge requests that passed with the commit each ends at, in
    order. The stack's prefixes are gated ``width`` at a time (the refinery's own gates: one), in the order
    ``plan.speculation`` says; what stood behind a culprit is stacked again on the prefix before it and gated
    again."""
    good: list[tuple[MergeRequest, str]] = []
    base = target_before
    pending = list(mrs)
    width = max(1, gates.backend.width)
    while pending:
        stack = _stack(paths, pending, base, target_before, result, gates)
        if result.rounds == 0:
            crash_point("refinery.after_rebase")
        result.rounds += 1
        if not stack:
            break
        lo, hi, failure = 0, None, None
        while positions := speculation.next_prefixes(lo, hi, len(stack), width):
            found = gates.first_red([stack[p - 1].candidate for p in positions])
            lo, hi = speculation.narrowed(lo, hi, positions, found[0] if found is not None else None)
            if found is not None:
                failure = found[1]
        if failure is None or hi is None:
            good += [(entry.mr, entry.candidate.commit) for entry in stack]
            break
        culprit = stack[hi - 1].mr
        result.outcomes[culprit.id] = Outcome(kind="failed", target_before=target_before, failure=failure)
        log.info("batch_culprit_found", mr=culprit.id, gate=failure.gate, position=hi, of=len(stack))
        good += [(entry.mr, entry.candidate.commit) for entry in stack[: hi - 1]]
        base = stack[hi - 2].candidate.commit if hi > 1 else base
        pending = [entry.mr for entry in stack[hi:]]
    return good


class Stacked(NamedTuple):
    """A merge request in a stack, and the candidate its prefix of the stack ends at."""

    mr: MergeRequest
    candidate: Candidate


def _stack(
    paths: Paths,
    pending: Sequence[MergeRequest],
    base: str,
    target_before: str,
    result: BatchResult,
    gates: Gates,
) -> list[Stacked]:
    """Rebase each merge request onto the one before (the first onto ``base``); the ones that could not be
    stacked get their outcome in ``result``. A prefix gated before under the same key (by a refinery that
    restarted since) is taken as it was, not replayed again: its gates' answer is adopted."""
    stack: list[Stacked] = []
    heads: list[tuple[str, str]] = []
    tip = base
    for mr in pending:
        if mr.bundle is not None:
            # Published by its session and imported when submitted: exactly the commit submitted, unless a person
            # resolving its conflict pushed the branch to the rig's repository (publish_branch put it there).
            imported = git.imported_ref(done_flow.publisher(mr.session, mr.branch), mr.head)
            # A crew member's is always its bundle: a person resolves a conflict in the member's
            # workspace and runs `gt done` again; a branch of that name on origin is nobody's say.
            pushed = _rev(paths, f"refs/remotes/origin/{mr.branch}") if crew_of_branch(mr.branch) is None else ""
            head = pushed or _rev(paths, imported)
        else:
            # The branch as it is now (a conflict resolved by force-pushing it counts), else the submitted commit.
            head = _rev(paths, f"refs/remotes/origin/{mr.branch}") or _rev(paths, f"{mr.head}^{{commit}}")
        if not head:
            missing = f"branch {mr.branch} does not exist and commit {mr.head} is not in the repository"
            result.outcomes[mr.id] = Outcome(
                kind="branch_missing", target_before=target_before, failure=_note("branch", missing)
            )
            continue
        # Queued at that time: one requeued since (a retry, a push that did not land) is gated afresh, never
        # answered by a job of before.
        entry = (f"{mr.id}/{mr.queued_at.isoformat()}", head)
        key = gates.key(base, [*heads, entry])
        adopted = gates.backend.adopted(key)
        rebased: str | None
        files: list[str] = []
        if adopted is not None and _rev(paths, f"{adopted}^{{commit}}") == adopted:
            rebased = adopted
        else:
            rebased, files = _rebase(paths, head, tip)
        if rebased is not None and rebased != tip:
            stack.append(Stacked(mr, Candidate(commit=rebased, key=key, stack=(*(e.mr.id for e in stack), mr.id))))
            heads.append(entry)
            tip = rebased
            continue
        if tip != target_before:
            # It does not fit on the others of the batch: see how it fits on the target alone.
            rebased, files = _rebase(paths, head, target_before)
        if rebased is None:
            result.outcomes[mr.id] = Outcome(kind="conflict", target_before=target_before, files=files)
        elif rebased == target_before:
            # Every commit is on the target already (a crash after an earlier push): never merged twice.
            result.outcomes[mr.id] = Outcome(
                kind="already_merged", target_before=target_before, merged_commit=target_before
            )
        else:
            others = ", ".join(entry.mr.id for entry in stack) or "the batch"
            reason = f"it does not apply on top of {others}; tried again after them"
            result.outcomes[mr.id] = Outcome(kind="deferred", target_before=target_before, reason=reason)
    return stack


def _rebase(paths: Paths, head: str, onto: str) -> tuple[str | None, list[str]]:
    """``head``'s own commits replayed onto ``onto`` in the clone (``git_replay``: as ``git rebase
    --reapply-cherry-picks --empty=drop`` would, with no work tree): (the new tip, []) or (None, conflicting
    files). A branch merged before (a crash after the push) comes out as ``onto`` itself."""
    replayed = git_replay.replay(paths.bare, head, onto)
    return replayed.tip, replayed.conflicts


def _rev(paths: Paths, ref: str) -> str:
    return git.git("rev-parse", "--verify", "--quiet", "--end-of-options", ref, cwd=paths.bare, check=False).strip()


def _note(gate: str, text: str, exit_code: int = 1) -> GateResult:
    return GateResult(gate=gate, exit_code=exit_code, seconds=0.0, tail=text, log_path="")


POLECAT_BRANCHES = "polecat/"


def publish_branch(paths: Paths, mr: MergeRequest) -> None:
    """Push a session's published head (imported from its bundle) to its branch on origin, for a person to
    resolve a conflict on (best effort: logged when refused)."""
    source = git.imported_ref(done_flow.publisher(mr.session, mr.branch), mr.head)
    receive = git.origin_receive_pack(paths.bare)
    git.git(
        "push", "--quiet", "--force", *receive, "--", "origin", f"{source}:refs/heads/{mr.branch}", cwd=paths.bare,
        check=False,
    )  # fmt: skip
    if not _rev(paths, f"refs/remotes/origin/{mr.branch}"):
        git.fetch(paths.bare)
    if not _rev(paths, f"refs/remotes/origin/{mr.branch}"):
        log.warning("branch_not_published", mr=mr.id, branch=mr.branch)


def delete_branch(paths: Paths, branch: str) -> None:
    """Delete the polecat branch on origin once merged (gone already is fine). Only a polecat's branch: one
    submitted by hand under another name is the operator's to keep or delete. The ref is named in full, after
    ``--``, so no name is ever read as an option."""
    if branch.startswith(POLECAT_BRANCHES):
        receive = git.origin_receive_pack(paths.bare)
        git.git(
            "push", "--quiet", "--delete", *receive, "--", "origin", f"refs/heads/{branch}", cwd=paths.bare, check=False
        )
