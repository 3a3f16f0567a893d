"""Processing one merge request with git and the rig's gates, in a temporary worktree. Blocking (run in a thread).

The rig's refinery clone lives in ``GT_HOME/rigs/<rig>/refinery/repo.git`` (its own, so it never races the
witness's git); temporary worktrees in ``.../refinery/work/<mr>``, removed when done or by the next attempt.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import msgspec
import structlog

from services.refinery.state import MergeRequest, RigInfo
from shared import git
from shared.faults import crash_point

log = structlog.get_logger(__name__)

TAIL_CHARS = 2000
GATES = ("setup", "lint", "test")


class GateResult(msgspec.Struct, frozen=True, kw_only=True):
    gate: str
    exit_code: int
    seconds: float
    tail: str
    log_path: str


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    """merged, already_merged, conflict, failed, target_moved, branch_missing."""
    target_before: str = ""
    merged_commit: str = ""
    files: list[str] = []
    failure: GateResult | None = None
    target_broken: GateResult | None = None
    """A gate that failed on the target too (the change was merged anyway)."""
    gates_run: int = 0


class Paths:
    def __init__(self, rigs_root: Path, rig: str) -> None:
        self.root = rigs_root / rig / "refinery"
        self.bare = self.root / "repo.git"
        self.work = self.root / "work"
        self.logs = self.root / "logs"

    def worktree(self, name: str) -> Path:
        return self.work / name


def gate_commands(rig: RigInfo) -> list[tuple[str, str]]:
    return [(g, c) for g, c in zip(GATES, (rig.setup_command, rig.lint_command, rig.test_command), strict=True) if c]


def clean_worktrees(paths: Paths) -> list[str]:
    """Remove every temporary worktree (left by a crash); their names."""
    if not paths.work.exists():
        return []
    removed = []
    for child in sorted(paths.work.iterdir()):
        git.force_remove(child)
        removed.append(child.name)
    if paths.bare.exists():
        git.git("worktree", "prune", cwd=paths.bare)
    return removed


def run_gate(gate: str, command: str, cwd: Path, log_path: Path, timeout: float) -> GateResult:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with log_path.open("wb") as out:
        try:
            done = subprocess.run(
                ["sh", "-c", command], cwd=cwd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False
            )
            code = done.returncode
        except subprocess.TimeoutExpired:
            out.write(f"\n[gastown] {gate} timed out after {timeout:g}s\n".encode())
            code = 124
    text = log_path.read_bytes()[-TAIL_CHARS * 4 :].decode(errors="replace")
    return GateResult(
        gate=gate, exit_code=code, seconds=time.monotonic() - began, tail=text[-TAIL_CHARS:], log_path=str(log_path)
    )


def _add_detached(paths: Paths, name: str, commit: str) -> Path:
    path = paths.worktree(name)
    if path.exists():
        git.force_remove(path)
    git.git("worktree", "prune", cwd=paths.bare)
    path.parent.mkdir(parents=True, exist_ok=True)
    git.git("worktree", "add", "--quiet", "--detach", str(path), commit, cwd=paths.bare)
    return path


def _remove(paths: Paths, path: Path) -> None:
    git.force_remove(path)
    git.git("worktree", "prune", cwd=paths.bare)


def _rev(paths: Paths, ref: str) -> str:
    return git.git("rev-parse", "--verify", "--quiet", ref, cwd=paths.bare, check=False).strip()


def process(paths: Paths, rig: RigInfo, mr: MergeRequest, *, attempt: int, gate_timeout: float) -> Outcome:
    """Rebase the merge request's head onto the target, run the gates, fast-forward the target."""
    git.ensure_bare_clone(rig.repo, paths.bare)
    git.fetch(paths.bare)
    target_ref = f"refs/remotes/origin/{mr.target}"
    target_before = _rev(paths, target_ref)
    if not target_before:
        return Outcome(kind="branch_missing", failure=_note("branch", f"the target branch {mr.target} does not exist"))
    # The branch as it is now (a conflict resolved by force-pushing it counts), else the submitted commit.
    head = _rev(paths, f"refs/remotes/origin/{mr.branch}") or _rev(paths, f"{mr.head}^{{commit}}")
    if not head:
        missing = f"branch {mr.branch} does not exist and commit {mr.head} is not in the repository"
        return Outcome(kind="branch_missing", target_before=target_before, failure=_note("branch", missing))
    work = _add_detached(paths, mr.id, head)
    try:
        git.git("rebase", "--quiet", target_before, cwd=work, check=False, timeout=300)
        if _rebase_in_progress(work):
            files = git.git("diff", "--name-only", "--diff-filter=U", cwd=work, check=False).split()
            git.git("rebase", "--abort", cwd=work, check=False)
            return Outcome(kind="conflict", target_before=target_before, files=files)
        crash_point("refinery.after_rebase")
        tip = git.git("rev-parse", "HEAD", cwd=work).strip()
        if _is_ancestor(work, tip, target_before):
            # Every commit is on the target already (a crash after an earlier push): never merged twice.
            return Outcome(kind="already_merged", target_before=target_before, merged_commit=target_before)
        gates_run = 0
        target_broken: GateResult | None = None
        for n, (gate, command) in enumerate(gate_commands(rig)):
            result = run_gate(gate, command, work, paths.logs / f"{mr.id}-{attempt}-{gate}.log", gate_timeout)
            gates_run += 1
            if n == 0:
                crash_point("refinery.during_gates")
            if result.exit_code == 0:
                continue
            on_target = _gate_on_target(paths, mr, target_before, gate, command, attempt, gate_timeout)
            gates_run += 1
            if on_target.exit_code == 0:
                return Outcome(kind="failed", target_before=target_before, failure=result, gates_run=gates_run)
            target_broken = target_broken or on_target  # not this change's fault: merge it anyway
        # A plain push only fast-forwards: if the target moved meanwhile it is refused and nothing is lost.
        git.git("push", "--quiet", "origin", f"{tip}:refs/heads/{mr.target}", cwd=work, check=False)
        remote = git.git("ls-remote", "origin", f"refs/heads/{mr.target}", cwd=work).split()
        if not remote or remote[0] != tip:
            return Outcome(kind="target_moved", target_before=target_before, gates_run=gates_run)
        crash_point("refinery.after_push")
        return Outcome(
            kind="merged",
            target_before=target_before,
            merged_commit=tip,
            gates_run=gates_run,
            target_broken=target_broken,
        )
    finally:
        _remove(paths, work)


def _is_ancestor(work: Path, commit: str, of: str) -> bool:
    try:
        git.git("merge-base", "--is-ancestor", commit, of, cwd=work)
    except git.GitError:
        return False
    return True


def _rebase_in_progress(work: Path) -> bool:
    git_dir = Path(git.git("rev-parse", "--git-dir", cwd=work).strip())
    if not git_dir.is_absolute():
        git_dir = work / git_dir
    return (git_dir / "rebase-merge").exists() or (git_dir / "rebase-apply").exists()


def _gate_on_target(
    paths: Paths, mr: MergeRequest, target: str, gate: str, command: str, attempt: int, timeout: float
) -> GateResult:
    work = _add_detached(paths, f"{mr.id}-target", target)
    try:
        return run_gate(gate, command, work, paths.logs / f"{mr.id}-{attempt}-{gate}-on-target.log", timeout)
    finally:
        _remove(paths, work)


def _note(gate: str, text: str) -> GateResult:
    return GateResult(gate=gate, exit_code=1, seconds=0.0, tail=text, log_path="")


def delete_branch(paths: Paths, branch: str) -> None:
    """Delete the polecat branch on origin once merged (gone already is fine)."""
    git.git("push", "--quiet", "origin", "--delete", branch, cwd=paths.bare, check=False)
