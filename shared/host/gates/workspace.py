"""The rig's gate workspace: one persistent worktree of the refinery's clone (``refinery/workspace``) where the gates
run, moved from one candidate commit to the next with a checkout whose cost follows the change, not the tree.

Nothing is rebased, merged or pushed from it (the merger replays commits in the clone itself, ``git_replay``, and
pushes from there): it only holds what the gates check. Before each use it is repaired: whatever a crash left in
it (a lock file, a rebase, merge or cherry-pick under way, a worktree no longer registered, a directory that is no
worktree) is cleared, or the workspace is made again; then it is checked out at exactly the commit, with every
file git does not track removed. Ignored files (build output, installed dependencies) survive between merges
unless the rig is pristine (``gate_pristine``), then they go too. Adapter: runs git.
"""

from __future__ import annotations

import threading
from pathlib import Path

import structlog

from shared.host import git, path_locks, safe_files

log = structlog.get_logger(__name__)

LEFTOVER_STATE = (
    "index.lock", "HEAD.lock", "rebase-merge", "rebase-apply", "MERGE_HEAD", "MERGE_MSG", "CHERRY_PICK_HEAD",
    "REVERT_HEAD", "sequencer", "BISECT_LOG", "AUTO_MERGE",
)  # fmt: skip
"""What an interrupted git leaves in a worktree's git directory: never there between two uses, so a leftover."""


def lock(path: Path) -> threading.Lock:
    """One user at a time of the workspace at ``path`` (the merge lease makes that so across refineries)."""
    return path_locks.lock(path)


def check_out(bare: Path, path: Path, commit: str, *, pristine: bool) -> Path:
    """The workspace at ``path`` (a worktree of ``bare``) holding exactly ``commit``: repaired or made first; what
    git does not track removed, ignored files too when ``pristine``.

    Raises:
        GitError: ``commit`` names no commit, or the workspace could not be made.
    """
    resolved = git.resolve_commit(bare, commit)
    if not _registered(bare, path):
        _make(bare, path, resolved)
    else:
        repaired = repair(path)
        if repaired:
            log.warning("gate_workspace_repaired", workspace=str(path), found=repaired)
        try:
            _move(path, resolved, pristine=pristine)
        except git.GitError as exc:
            log.warning("gate_workspace_made_again", workspace=str(path), error=str(exc)[:500])
            _make(bare, path, resolved)
    head = git.git("rev-parse", "HEAD", cwd=path).strip()
    if head != resolved:
        raise git.GitError(["checkout", resolved], 1, f"the gate workspace {path} is at {head}, not {resolved}")
    return path


def repair(path: Path) -> list[str]:
    """Clear what an interrupted git left in the worktree at ``path``; the names found. Only called while nothing
    else uses it (``lock``, and the merge lease)."""
    git_dir = _git_dir(path)
    if git_dir is None:
        return []
    found = []
    for name in LEFTOVER_STATE:
        leftover = git_dir / name
        if leftover.is_symlink() or leftover.exists():
            found.append(name)
            if leftover.is_dir() and not leftover.is_symlink():
                git.force_remove(leftover)
            else:
                leftover.unlink()
    return found


def _move(path: Path, commit: str, *, pristine: bool) -> None:
    """Check ``commit`` out over whatever the workspace holds (``--force``: a file a gate changed is restored),
    then remove what git does not track (ignored files kept unless ``pristine``)."""
    git.checkout_clean(path, ("--detach", commit), "-ffdx" if pristine else "-ffd")


def _make(bare: Path, path: Path, commit: str) -> None:
    if path.exists() or path.is_symlink():
        git.force_remove(path)
    git.git("worktree", "prune", cwd=bare)
    path.parent.mkdir(parents=True, exist_ok=True)
    git.git("worktree", "add", "--quiet", "--force", "--detach", "--end-of-options", str(path), commit, cwd=bare)


def _registered(bare: Path, path: Path) -> bool:
    """Whether ``path`` is a worktree of ``bare`` whose ``.git`` file points where ``bare`` keeps it."""
    git_dir = _git_dir(path)
    return git_dir is not None and git_dir.parent == (bare / "worktrees").resolve() and (git_dir / "HEAD").is_file()


def _git_dir(path: Path) -> Path | None:
    """The git directory the worktree's ``.git`` file names; None when it is no worktree."""
    try:
        text = safe_files.read_beneath(path, ".git", cap=4096).decode(errors="replace").strip()
    except OSError:
        return None
    if not text.startswith("gitdir: "):
        return None
    found = Path(text[len("gitdir: ") :])
    return (found if found.is_absolute() else path / found).resolve()


def remove(bare: Path, path: Path) -> None:
    """The workspace gone (a rig removed, or made again)."""
    git.force_remove(path)
    if bare.exists():
        git.git("worktree", "prune", cwd=bare, check=False)
