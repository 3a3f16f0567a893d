"""The rig's gate workspace: one persistent worktree of the refinery's clone (``refinery/workspace``) where the gates
run, moved from one candidate commit to the next with a checkout whose cost follows the change, not the tree.

Nothing is rebased, merged or pushed from it (the merger replays commits in the clone itself, ``git_replay``, and
pushes from there): it only holds what the gates check. Before each use it is repaired: whatever a crash left in
it (a lock file, a rebase, merge or cherry-pick under way, a worktree no longer registered, a directory that is no
worktree) is cleared, or the workspace is made again; then it is checked out at exactly the commit, with every
file git does not track removed. Ignored files (build output, installed dependencies) survive between merges
unless the rig is pristine (``gate_pristine``), then they go too. Adapter: runs git.

The full pass (``checkout --force`` and ``clean``) looks at every file: a gate may have changed any of them. It is
taken off the critical path (``used``): once a probe's gates are done, a thread of this process puts the workspace
back at the probed commit with the full pass while the caller goes on, holding the workspace's lock (the
refinery's only once its batch was pushed: on two cores a pass over 50,000 files beside the push doubled the
push); when that pass succeeded the workspace is remembered as settled there, in memory only (a gate could forge a
file; a restart forgets it). Nothing runs in the workspace between that and the next probe (every gate process is
dead by then, ``runs``), so the next probe moves it with what differs between the two commits' trees alone
(``_moved_fast``), and forgets the mark first: its own gates will dirty the workspace. A git run in it since (another
refinery of the same GT_HOME after a takeover, a person) wrote another index: the mark's index stamp no longer
matches and the full pass runs. A file written there without git by a process of the refinery's OS user is not
seen; that user's processes could change the clone and the refinery itself as well (gates that must not are run
as ``GT_GATE_USER``, whose workspaces this does not move).
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import structlog

from shared.host import git, path_locks, safe_files, tree_moves

log = structlog.get_logger(__name__)

LEFTOVER_STATE = (
    "index.lock", "HEAD.lock", "rebase-merge", "rebase-apply", "MERGE_HEAD", "MERGE_MSG", "CHERRY_PICK_HEAD",
    "REVERT_HEAD", "sequencer", "BISECT_LOG", "AUTO_MERGE",
)  # fmt: skip
"""What an interrupted git leaves in a worktree's git directory: never there between two uses, so a leftover."""
SETTLE_HOLD_S = 30.0
"""The longest a held settle (``used``'s ``hold``) waits for ``release_settle``: a caller that never says is no
reason to leave the workspace unsettled."""
SETTLE_EXIT_WAIT_S = 20.0
"""How long a process exiting waits for the settles under way (``_wait_at_exit``): past that the thread dies with
it, the workspace unsettled, and the next process's first probe repairs it with the full pass."""


class Settled(NamedTuple):
    """A workspace the full pass put at ``commit`` (``pristine``: ignored files removed too), as it was left: the
    identity of the index that pass wrote (``_index_stamp``)."""

    commit: str
    pristine: bool
    index_stamp: tree_moves.IndexStamp


_settled: dict[Path, Settled] = {}
"""Workspace -> where the full pass left it, since no gate ran in it: read and changed under the workspace's lock."""
_settling: set[threading.Thread] = set()
_settling_lock = threading.Lock()
_held_back: dict[Path, threading.Event] = {}
"""Workspace -> what lets its held settle start (``used``'s ``hold``)."""


def lock(path: Path) -> threading.Lock:
    """One user at a time of the workspace at ``path`` (the merge lease makes that so across refineries)."""
    return path_locks.lock(path)


@contextlib.contextmanager
def used(bare: Path, path: Path, commit: str, *, pristine: bool, hold: bool = False) -> Iterator[Path]:
    """The workspace at ``path`` checked out at ``commit`` (``check_out``) for the caller's gates, under its lock;
    once they are done (the block left without an error), a thread settles it again at ``commit`` (``settle``)
    and only then lets the lock go, while the caller goes on. With ``hold`` that thread waits for
    ``release_settle`` first (the caller's push must not share the machine with a pass over the whole tree), or
    for the workspace to be wanted again, or ``SETTLE_HOLD_S``.

    Raises:
        GitError: ``commit`` names no commit, or the workspace could not be made.
    """
    release_settle(path)  # a settle held back for this workspace: it goes now, and this waits for it
    held = lock(path)
    held.acquire()
    try:
        resolved = _checked_out(bare, path, commit, pristine=pristine)
        yield path
    except BaseException:
        held.release()
        raise
    go = threading.Event()
    if hold:
        with _settling_lock:
            _held_back[path] = go
    else:
        go.set()
    _settle_in_background(bare, path, resolved, pristine, held, go)


def release_settle(path: Path) -> None:
    """Let the settle held back for the workspace at ``path`` (``used``'s ``hold``), if any, start."""
    with _settling_lock:
        go = _held_back.pop(path, None)
    if go is not None:
        go.set()


def check_out(bare: Path, path: Path, commit: str, *, pristine: bool) -> Path:
    """The workspace at ``path`` (a worktree of ``bare``) holding exactly ``commit``: repaired or made first; what
    git does not track removed, ignored files too when ``pristine``. A workspace settled since its last gates
    (``settle``) is moved by the change alone. The caller holds ``lock``.

    Raises:
        GitError: ``commit`` names no commit, or the workspace could not be made.
    """
    _checked_out(bare, path, commit, pristine=pristine)
    return path


def _checked_out(bare: Path, path: Path, commit: str, *, pristine: bool) -> str:
    """``check_out``; the full id of ``commit``."""
    resolved = git.resolve_commit(bare, commit)
    settled = forget(path)  # the caller's gates will dirty it
    if not _registered(bare, path):
        _make(bare, path, resolved)
    else:
        repaired = repair(path)
        if repaired:
            log.warning("gate_workspace_repaired", workspace=str(path), found=repaired)
        began = time.monotonic()
        try:
            fast = (
                settled is not None and not repaired and _moved_fast(bare, path, settled, resolved, pristine=pristine)
            )
            if not fast:
                _move(path, resolved, pristine=pristine)
            log.info("gate_workspace_moved", workspace=str(path), fast=fast, seconds=time.monotonic() - began)
        except git.GitError as exc:
            log.warning("gate_workspace_made_again", workspace=str(path), error=str(exc)[:500])
            _make(bare, path, resolved)
    head = git.git("rev-parse", "HEAD", cwd=path).strip()
    if head != resolved:
        raise git.GitError(["checkout", resolved], 1, f"the gate workspace {path} is at {head}, not {resolved}")
    return resolved


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


def settle(bare: Path, path: Path, commit: str, *, pristine: bool) -> bool:
    """Put the workspace back at ``commit`` with the full pass (whatever a gate did to it: files, links, leftovers
    in its git directory) and remember it settled there; whether it was. The caller holds ``lock``, and no gate
    of the workspace runs.

    Raises:
        GitError: the full pass failed (the workspace stays unsettled).
    """
    forget(path)
    if not _registered(bare, path):
        return False  # a gate broke the link to the clone: the next probe makes it again
    repaired = repair(path)
    if repaired:
        log.warning("gate_workspace_repaired", workspace=str(path), found=repaired)
    _move(path, commit, pristine=pristine)
    head = git.git("rev-parse", "HEAD", cwd=path).strip()
    index = _index_stamp(path)
    if head != commit or index is None:
        return False
    _settled[path] = Settled(commit=commit, pristine=pristine, index_stamp=index)
    return True


def settled_at(path: Path) -> Settled | None:
    """Where the workspace at ``path`` was settled since its last gates, if it was."""
    return _settled.get(path)


def forget(path: Path) -> Settled | None:
    """The workspace at ``path`` no longer counted as settled (its gates are about to run, or it is removed);
    where it was."""
    return _settled.pop(path, None)


def _settle_in_background(
    bare: Path, path: Path, commit: str, pristine: bool, held: threading.Lock, go: threading.Event
) -> None:
    """``settle`` in a thread of its own, once ``go`` is set, that lets ``held`` (the workspace's lock, held now)
    go when done."""
    thread = threading.Thread(
        target=_settle_then_release, args=(bare, path, commit, pristine, held, go), name=f"settle {path}", daemon=True
    )
    with _settling_lock:
        _settling.add(thread)
    try:
        thread.start()
    except RuntimeError:  # no new thread (the interpreter is exiting): unsettled, the next probe takes the full pass
        with _settling_lock:
            _settling.discard(thread)
        release_settle(path)
        held.release()


def _settle_then_release(
    bare: Path, path: Path, commit: str, pristine: bool, held: threading.Lock, go: threading.Event
) -> None:
    go.wait(SETTLE_HOLD_S)
    with _settling_lock:
        if _held_back.get(path) is go:
            del _held_back[path]
    began = time.monotonic()
    try:
        settled = settle(bare, path, commit, pristine=pristine)
        log.info("gate_workspace_settled", workspace=str(path), settled=settled, seconds=time.monotonic() - began)
    except Exception:  # logged, never raised: the caller went on; the next probe takes the full pass
        forget(path)
        log.exception("gate_workspace_settle_failed", workspace=str(path))
    finally:
        held.release()
        with _settling_lock:
            _settling.discard(threading.current_thread())


def wait_for_settles(timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for the settles under way (those held back start now); whether none is
    left."""
    with _settling_lock:
        held_back = list(_held_back)
    for path in held_back:
        release_settle(path)
    deadline = time.monotonic() + timeout
    while True:
        with _settling_lock:
            running = [thread for thread in _settling if thread.is_alive()]
        if not running:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        running[0].join(left)


@atexit.register
def _wait_at_exit() -> None:
    """A clean exit lets a settle under way finish (a git killed mid-checkout would leave it for the next start to
    repair), for a while: never forever."""
    if not wait_for_settles(SETTLE_EXIT_WAIT_S):
        log.warning("gate_workspace_settle_abandoned", seconds=SETTLE_EXIT_WAIT_S)


def _moved_fast(bare: Path, path: Path, settled: Settled, commit: str, *, pristine: bool) -> bool:
    """Move the settled workspace at ``path`` (a worktree of ``bare``) to ``commit`` by what differs between the two
    commits' trees alone (those files written or removed, their index entries and HEAD updated): what the full pass
    would leave, since every other file is as the full pass left it. False, with nothing or only some of it done,
    when the change is not one it moves exactly (the full pass then does it all).

    Files that are neither in the index nor ignored cannot be there (the full pass removed them and nothing ran
    since), ignored ones stay as the full pass would keep them (the ignore rules are unchanged:
    ``tree_moves.RULE_FILES``)."""
    if settled.pristine != pristine or _index_stamp(path) != settled.index_stamp:
        return False
    try:
        if not tree_moves.moved(bare, path, settled.commit, commit):
            return False
        git.git("update-ref", "--no-deref", "HEAD", commit, settled.commit, cwd=path)
    except (git.GitError, UnicodeError) as exc:  # UnicodeError: a path git wrote that is not UTF-8
        log.warning("gate_workspace_fast_move_failed", workspace=str(path), error=str(exc)[:500])
        return False
    return True


def _index_stamp(path: Path) -> tree_moves.IndexStamp | None:
    """The identity of the workspace's index file (``tree_moves.index_stamp``)."""
    git_dir = _git_dir(path)
    return None if git_dir is None else tree_moves.index_stamp(git_dir / "index")


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
    forget(path)
    git.force_remove(path)
    if bare.exists():
        git.git("worktree", "prune", cwd=bare, check=False)
