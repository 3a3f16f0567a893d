"""Processing merge requests with git and the rig's gates. Blocking (run in a thread).

One code path serves serial and batch mode: a batch of one is the serial case. The merge requests are rebased
one on top of the other onto the target (a stack), the gates run once on the stack's tip, and when they fail
the stack is bisected: the first prefix that fails names the culprit, the prefix before it (tested green) is
kept, and the rest is stacked again on it and gated again, until what remains is green. One fast-forward push
then lands everything that passed.

The rig's refinery clone lives in ``GT_HOME/rigs/<rig>/refinery/repo.git`` (its own, so it never races the
witness's git). Merge requests are rebased in the clone itself, with no work tree (``git_replay``: the cost
follows the change), and pushed from there; the gates run in the rig's persistent gate workspace
(``workspace``: ``.../refinery/workspace``), or with a gate user in that user's (``gate_user``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import structlog

from services.refinery.effects import gate_runs, workspace
from services.refinery.effects.gate_user import GateUser, GateWorkspaces, gate_user_environment
from services.refinery.plan import refusals
from services.refinery.plan.outcomes import BatchResult, GateResult, Outcome, TargetFailed
from services.refinery.state import MergeRequest
from shared.core.faults import crash_point
from shared.host import git, git_replay, path_locks
from shared.model.commands import MergeRequestSubmit
from shared.model.rigs import Rig

log = structlog.get_logger(__name__)

TAIL_CHARS = 2000
GATES = ("setup", "lint", "test")
GATE_BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME")
"""What a gate gets of the refinery's environment, besides the names its rig lists (``gate_env``): gates run code
an agent wrote, so never the refinery's NATS credentials, the town's settings or whatever else the host holds."""


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
        """Records of the gates running now (``gate_runs``): what a refinery starting stops first."""


def gate_commands(rig: Rig) -> list[tuple[str, str]]:
    return [(g, c) for g, c in zip(GATES, (rig.setup_command, rig.lint_command, rig.test_command), strict=True) if c]


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
            stopped = gate_runs.stop_leftovers(paths.gates)
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


def gate_environment(names: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The allowlisted variables of ``environ`` (``GATE_BASE_ENV`` and the rig's ``names``) that are set."""
    return {key: environ[key] for key in (*GATE_BASE_ENV, *names) if key in environ}


def run_gate(
    gate: str,
    command: str,
    cwd: Path,
    log_path: Path,
    timeout: float,
    env: Mapping[str, str],
    as_user: GateUser | None = None,
    *,
    records: Path,
) -> GateResult:
    """Run ``command`` through ``sh -c`` in ``cwd`` with exactly ``env`` (as ``as_user`` when given), its output
    in ``log_path`` (written by the refinery: the gate gets only the open file), under a watcher that stops it
    and everything it started when the refinery goes away (``gate_runs``; ``records``: where it is recorded)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with log_path.open("wb") as out:
        code = gate_runs.run(
            ["sh", "-c", command], cwd=cwd, env=env, out=out, timeout=timeout, records=records, as_user=as_user
        )
        if code is None:
            out.write(f"\n[gastown] {gate} timed out after {timeout:g}s\n".encode())
            code = 124
    text = log_path.read_bytes()[-TAIL_CHARS * 4 :].decode(errors="replace")
    return GateResult(
        gate=gate, exit_code=code, seconds=time.monotonic() - began, tail=text[-TAIL_CHARS:], log_path=str(log_path)
    )


class Gates:
    """Runs the rig's gates on commits and keeps count. A gate that fails is run once on the target too: if the
    target fails it as well, it blames nobody and the batch stops (``TargetFailed``): nothing merges with a gate
    skipped."""

    def __init__(
        self,
        paths: Paths,
        rig: Rig,
        target: str,
        name: str,
        timeout: float,
        gate_workspaces: GateWorkspaces | None = None,
    ) -> None:
        self.paths, self.rig, self.target, self.name, self.timeout = paths, rig, target, name, timeout
        self.env = gate_environment(rig.gate_env, os.environ)
        self.gate_workspaces = gate_workspaces
        self.user: GateUser | None = gate_workspaces.user if gate_workspaces is not None else None
        self.pristine = rig.gate_pristine
        self.runs = 0
        self.seconds = 0.0
        self.passes_on_target: set[str] = set()

    def failure(self, commit: str) -> GateResult | None:
        """The first gate that fails on ``commit`` (and not on the target), or None.

        Raises:
            TargetFailed: the gate that failed fails on the target's tip too.
        """
        probe = self.runs
        failed: tuple[str, str, GateResult] | None = None
        with self._workspace(commit) as (where, env):
            for gate, command in gate_commands(self.rig):
                result = self._run(gate, command, where, env, f"{self.name}-p{probe}-{gate}.log")
                if result.exit_code != 0:
                    failed = (gate, command, result)
                    break
        if failed is None:
            return None
        gate, command, result = failed
        if gate not in self.passes_on_target:
            # Out of the probe's workspace first: the target is checked out in the same one.
            on_target = self._on_target(gate, command)
            if on_target is not None:
                raise TargetFailed(on_target, command, self.target)
        return result

    @contextlib.contextmanager
    def _workspace(self, commit: str) -> Iterator[tuple[Path, dict[str, str]]]:
        """Where the gates of one probe run, at ``commit``, and with what environment: the rig's gate workspace, or
        with a gate user that user's (``gate_user.GateWorkspaces``); the probe's gates share it (set-up output)."""
        if self.gate_workspaces is None:
            with workspace.lock(self.paths.workspace):
                yield (
                    workspace.check_out(self.paths.bare, self.paths.workspace, commit, pristine=self.pristine),
                    self.env,
                )
            return
        user = self.gate_workspaces.user
        with self.gate_workspaces.prepared(self.paths.home, self.paths.bare, commit, pristine=self.pristine) as place:
            yield place / "work", gate_user_environment(user, self.env, place)

    def _run(self, gate: str, command: str, work: Path, env: dict[str, str], log_name: str) -> GateResult:
        log_path = self.paths.logs / log_name
        result = run_gate(gate, command, work, log_path, self.timeout, env, self.user, records=self.paths.gates)
        self.runs += 1
        self.seconds += result.seconds
        if self.runs == 1:
            crash_point("refinery.during_gates")
        return result

    def _on_target(self, gate: str, command: str) -> GateResult | None:
        """The gate's failure on the target's tip, or None when it passes there."""
        with self._workspace(self.target) as (where, env):
            result = self._run(gate, command, where, env, f"{self.name}-{gate}-on-target.log")
        if result.exit_code == 0:
            self.passes_on_target.add(gate)
            return None
        return result


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
        session = mr.session or ""
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
) -> BatchResult:
    """Land what can be landed of ``mrs`` (in this order) on their target with one fast-forward push.

    ``lost_lease`` is asked right before the push: a refinery that lost the rig's merge lease pushes nothing.
    ``gate_workspaces``: the gate user's workspaces when gates run as another OS user, None for the refinery's own.
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
    gates = Gates(paths, rig, target_before, name, gate_timeout, gate_workspaces)
    try:
        good = _land_in_rounds(paths, mrs, target_before, gates, result)
    except TargetFailed as exc:
        # Not theirs: every merge request not settled yet goes back into the queue, nothing is pushed.
        result.target_failed = exc
        for mr in mrs:
            if mr.id not in result.outcomes:
                result.outcomes[mr.id] = Outcome(kind="target_failed", target_before=target_before, failure=exc.result)
        good = []
    result.gates_run, result.gate_seconds = gates.runs, gates.seconds
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
    """Stack, gate, bisect on red; the merge requests that passed with the commit each ends at, in order."""
    good: list[tuple[MergeRequest, str]] = []
    base = target_before
    pending = list(mrs)
    while pending:
        stack = _stack(paths, pending, base, target_before, result)
        if result.rounds == 0:
            crash_point("refinery.after_rebase")
        result.rounds += 1
        if not stack:
            break
        failure = gates.failure(stack[-1][1])
        if failure is None:
            good += stack
            break
        # Red: the shortest failing prefix ends at the culprit. ``lo`` is green (the base), ``hi`` red.
        lo, hi = 0, len(stack)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            found = gates.failure(stack[mid - 1][1])
            if found is None:
                lo = mid
            else:
                hi, failure = mid, found
        culprit = stack[hi - 1][0]
        result.outcomes[culprit.id] = Outcome(kind="failed", target_before=target_before, failure=failure)
        log.info("batch_culprit_found", mr=culprit.id, gate=failure.gate, position=hi, of=len(stack))
        good += stack[: hi - 1]
        base = stack[hi - 2][1] if hi > 1 else base
        pending = [mr for mr, _ in stack[hi:]]
    return good


def _stack(
    paths: Paths,
    pending: Sequence[MergeRequest],
    base: str,
    target_before: str,
    result: BatchResult,
) -> list[tuple[MergeRequest, str]]:
    """Rebase each merge request onto the one before (the first onto ``base``); the ones that could not be
    stacked get their outcome in ``result``."""
    stack: list[tuple[MergeRequest, str]] = []
    tip = base
    for mr in pending:
        if mr.bundle is not None:
            # Published by its session and imported when submitted: exactly the commit submitted, unless a person
            # resolving its conflict pushed the branch to the rig's repository (publish_branch put it there).
            imported = git.imported_ref(mr.session or "", mr.head)
            head = _rev(paths, f"refs/remotes/origin/{mr.branch}") or _rev(paths, imported)
        else:
            # The branch as it is now (a conflict resolved by force-pushing it counts), else the submitted commit.
            head = _rev(paths, f"refs/remotes/origin/{mr.branch}") or _rev(paths, f"{mr.head}^{{commit}}")
        if not head:
            missing = f"branch {mr.branch} does not exist and commit {mr.head} is not in the repository"
            result.outcomes[mr.id] = Outcome(
                kind="branch_missing", target_before=target_before, failure=_note("branch", missing)
            )
            continue
        rebased, files = _rebase(paths, head, tip)
        if rebased is not None and rebased != tip:
            stack.append((mr, rebased))
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
            others = ", ".join(m.id for m, _ in stack) or "the batch"
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
    source = git.imported_ref(mr.session or "", mr.head)
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
